//! Session commands that change settings: SET, RESET, SET ROLE, SET SESSION AUTHORIZATION and
//! SET TRANSACTION. With transaction pooling the session tracks these so that it can replay them
//! on another server connection and key cached results on the settings they depend on.

use pg_query::protobuf::{self, a_const, node::Node as NodeEnum, VariableSetKind};

use crate::text::{const_str, expr_sql};
use crate::transaction::{transaction_modes, TransactionModes};
use crate::SqlError;

/// A statement that changes a run-time setting.
///
/// Setting names are lower-cased: PostgreSQL compares them case-insensitively, so `TimeZone`
/// and `timezone` are one setting. Forms with their own syntax arrive under the name the parser
/// gives them: `SET TIME ZONE` is `timezone`, `SET NAMES` is `client_encoding`, `SET SCHEMA`
/// is `search_path`, `SET XML OPTION` is `xmloption`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetCommand {
    /// `SET [SESSION | LOCAL] name {TO | =} value [, ...]`. `local` settings end with the
    /// transaction.
    Assign {
        name: String,
        values: Vec<SetValue>,
        local: bool,
    },
    /// `SET name TO DEFAULT`, `SET TIME ZONE LOCAL`: back to the session's default value.
    Default { name: String, local: bool },
    /// `SET name FROM CURRENT`.
    FromCurrent { name: String, local: bool },
    /// `RESET name`.
    Reset { name: String },
    /// `RESET ALL`.
    ResetAll,
    /// `SET [LOCAL] ROLE name`, or with `role: None`: `SET ROLE NONE`, `RESET ROLE`,
    /// `SET role TO DEFAULT`. The current user changes, and with it privileges and row-level
    /// security, so results seen before may not be visible after.
    Role { role: Option<String>, local: bool },
    /// `SET [LOCAL] SESSION AUTHORIZATION user`, or with `user: None`: `... DEFAULT` and
    /// `RESET SESSION AUTHORIZATION`. Changes the session user and the current user.
    SessionAuthorization { user: Option<String>, local: bool },
    /// `SET TRANSACTION ...`: modes of the current transaction only.
    Transaction(TransactionModes),
    /// `SET SESSION CHARACTERISTICS AS TRANSACTION ...`: default modes of later transactions.
    SessionCharacteristics(TransactionModes),
    /// `SET TRANSACTION SNAPSHOT 'id'`: the transaction sees another transaction's snapshot.
    TransactionSnapshot { snapshot_id: String },
}

/// One value of a `SET`. PostgreSQL does not distinguish a quoted string from a bare word here
/// (`SET x = on` and `SET x = 'on'` are the same), so both are [`SetValue::Text`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetValue {
    /// A string or a word, unquoted: `UTC`, `on`, `public`, `B` (from `"B"`).
    Text(String),
    /// An integer literal.
    Integer(i64),
    /// A numeric literal, as written (`1.5`, `-2e3`).
    Numeric(String),
    /// Anything else, as SQL text, e.g. `INTERVAL '+02:00' HOUR TO MINUTE` for `SET TIME ZONE`.
    Expr(String),
}

impl SetValue {
    /// The value as a SQL literal, for replaying the setting with `SET name TO <values>` on
    /// another server connection. Text is quoted, in `E''` form when it holds a backslash so
    /// that the result is the same whatever `standard_conforming_strings` says.
    pub fn to_sql(&self) -> String {
        match self {
            Self::Text(text) if text.contains('\\') => {
                format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
            }
            Self::Text(text) => format!("'{}'", text.replace('\'', "''")),
            Self::Integer(i) => i.to_string(),
            Self::Numeric(n) | Self::Expr(n) => n.clone(),
        }
    }
}

/// Classifies a `VariableSetStmt`; `None` only for a kind this pg_query does not know.
pub(crate) fn set_command(
    stmt: &protobuf::VariableSetStmt,
) -> Result<Option<SetCommand>, SqlError> {
    let name = stmt.name.to_ascii_lowercase();
    let local = stmt.is_local;
    let kind = stmt.kind();
    let first_text = || stmt.args.first().and_then(const_str).map(str::to_owned);
    let command = match (kind, name.as_str()) {
        (VariableSetKind::Undefined, _) => return Ok(None),
        (VariableSetKind::VarResetAll, _) => SetCommand::ResetAll,
        (VariableSetKind::VarSetMulti, "transaction") => {
            SetCommand::Transaction(transaction_modes(&stmt.args))
        }
        (VariableSetKind::VarSetMulti, "session characteristics") => {
            SetCommand::SessionCharacteristics(transaction_modes(&stmt.args))
        }
        (VariableSetKind::VarSetMulti, "transaction snapshot") => SetCommand::TransactionSnapshot {
            snapshot_id: first_text().unwrap_or_default(),
        },
        (VariableSetKind::VarSetMulti, _) => return Ok(None),
        (VariableSetKind::VarSetValue, "role") => SetCommand::Role {
            role: first_text().filter(|role| role != "none"),
            local,
        },
        (VariableSetKind::VarSetValue, "session_authorization") => {
            SetCommand::SessionAuthorization {
                user: first_text(),
                local,
            }
        }
        (_, "role") if kind != VariableSetKind::VarSetCurrent => {
            SetCommand::Role { role: None, local }
        }
        (_, "session_authorization") if kind != VariableSetKind::VarSetCurrent => {
            SetCommand::SessionAuthorization { user: None, local }
        }
        (VariableSetKind::VarSetValue, _) => SetCommand::Assign {
            name,
            values: set_values(&stmt.args)?,
            local,
        },
        (VariableSetKind::VarSetDefault, _) => SetCommand::Default { name, local },
        (VariableSetKind::VarSetCurrent, _) => SetCommand::FromCurrent { name, local },
        (VariableSetKind::VarReset, _) => SetCommand::Reset { name },
    };
    Ok(Some(command))
}

fn set_values(args: &[protobuf::Node]) -> Result<Vec<SetValue>, SqlError> {
    args.iter()
        .map(|arg| {
            let value = match &arg.node {
                Some(NodeEnum::AConst(c)) => match &c.val {
                    Some(a_const::Val::Sval(s)) => Some(SetValue::Text(s.sval.clone())),
                    Some(a_const::Val::Ival(i)) => Some(SetValue::Integer(i.ival.into())),
                    Some(a_const::Val::Fval(f)) => Some(SetValue::Numeric(f.fval.clone())),
                    _ => None,
                },
                _ => None,
            };
            match value {
                Some(value) => Ok(value),
                None => expr_sql(arg, "SET value").map(SetValue::Expr),
            }
        })
        .collect()
}
