//! The literal-blanking lexer against an oracle: texts made of tokens whose own shape is known
//! (a word stays, a literal becomes `?`, a comment a blank), so the shape of the whole text is
//! the shapes of its tokens joined. Catches runs copied twice, cut short or out of order.

use proptest::prelude::*;

/// A token and the shape it must leave.
fn token() -> impl Strategy<Value = (String, String)> {
    let word = "[A-Za-z_][A-Za-z0-9_$]{0,8}|[é日本][a-z0-9]{0,3}".prop_map(|w| (w.clone(), w));
    let number = "[0-9]{1,6}(\\.[0-9]{1,3})?(e-[0-9])?|\\.[0-9]{1,3}".prop_map(|n| (n, "?".into()));
    let string = "[a-z ;,é]{0,8}".prop_map(|v| (format!("'{}'", v), "?".into()));
    let doubled = "[a-z]{0,3}".prop_map(|v| (format!("'{v}''{v}'"), "?".into()));
    let dollar = "[a-z ']{0,8}".prop_map(|v| (format!("$q${v}$q$"), "?".into()));
    let quoted_ident = "[a-z 0-9']{1,6}".prop_map(|v| (format!("\"{v}\""), format!("\"{v}\"")));
    let block = "[a-z ]{0,8}".prop_map(|v| (format!("/* {v} */"), " ".into()));
    let line = "[a-z ]{0,8}".prop_map(|v| (format!("-- {v}\n"), " \n".into()));
    let punct = prop::sample::select(vec![
        "(", ")", ",", "=", "<", ">", "*", "+", ";", "::", "$1",
    ])
    .prop_map(|p| (p.to_owned(), p.to_owned()));
    prop_oneof![
        3 => word,
        2 => number,
        2 => string,
        1 => doubled,
        1 => dollar,
        1 => quoted_ident,
        1 => block,
        1 => line,
        2 => punct,
    ]
}

proptest! {
    #[test]
    fn shape_is_the_tokens_shapes_joined(tokens in prop::collection::vec(token(), 0..24)) {
        let text: Vec<&str> = tokens.iter().map(|(t, _)| t.as_str()).collect();
        let want: Vec<&str> = tokens.iter().map(|(_, s)| s.as_str()).collect();
        let (text, want) = (text.join(" "), want.join(" "));
        let shape = sql::shape(&text, true);
        prop_assert_eq!(shape.text, want, "text: {}", text);
        prop_assert!(!shape.time_literal);
        prop_assert!(shape.hints.is_empty());
    }
}

#[test]
fn time_words_are_found_whatever_the_quoting() {
    for (sql, time) in [
        ("select 'now'::timestamptz", true),
        ("select ' Today '::date", true),
        ("select 'tomorrow 10:00'::timestamp", true),
        ("select $$yesterday$$::date", true),
        ("select 'nowhere'", false),
        // The quote is punctuation, which the date/time lexer skips: `'now''s'::timestamptz`
        // is the current time.
        ("select 'now''s'", true),
        ("select 'now", true),
        // An escape string is read as PostgreSQL reads it: `\w` is `w`.
        ("select E'no\\w'", true),
        ("select E'no\\'w'", false),
    ] {
        assert_eq!(sql::shape(sql, true).time_literal, time, "{sql}");
    }
}
