//! What a differential script is made of: protocol-level operations, grouped into steps that
//! one client sends in one write, and their encoding (through `txn_support::msg`, which the
//! other transcript tests use too).

use std::fmt;

use crate::txn_support::msg;

/// Which of the script's two clients speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    A,
    B,
}

impl Who {
    pub fn index(self) -> usize {
        match self {
            Who::A => 0,
            Who::B => 1,
        }
    }

    pub fn other(self) -> Who {
        match self {
            Who::A => Who::B,
            Who::B => Who::A,
        }
    }
}

/// One frontend message.
#[derive(Clone, Debug)]
pub enum Op {
    Query(String),
    Parse {
        name: &'static str,
        sql: String,
        types: Vec<u32>,
    },
    Bind {
        portal: &'static str,
        statement: &'static str,
        params: Vec<Option<String>>,
    },
    Describe {
        kind: u8,
        name: &'static str,
    },
    Execute {
        portal: &'static str,
        max_rows: u32,
    },
    Close {
        kind: u8,
        name: &'static str,
    },
    Sync,
    Flush,
}

impl Op {
    fn encode(&self) -> Vec<u8> {
        match self {
            Op::Query(sql) => msg::query(sql),
            Op::Parse { name, sql, types } => msg::parse(name, sql, types),
            Op::Bind {
                portal,
                statement,
                params,
            } => {
                let params: Vec<Option<&str>> = params.iter().map(Option::as_deref).collect();
                msg::bind(portal, statement, &params)
            }
            Op::Describe { kind, name } => msg::describe(*kind, name),
            Op::Execute { portal, max_rows } => msg::execute(portal, *max_rows),
            Op::Close { kind, name } => msg::close(*kind, name),
            Op::Sync => msg::sync(),
            Op::Flush => msg::flush(),
        }
    }

    /// Whether the server answers this message with a ReadyForQuery.
    pub fn ends_with_ready(&self) -> bool {
        matches!(self, Op::Query(_) | Op::Sync)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Query(sql) => write!(f, "Query({sql:?})"),
            Op::Parse { name, sql, types } => write!(f, "Parse({name:?}, {sql:?}, {types:?})"),
            Op::Bind {
                portal,
                statement,
                params,
            } => write!(f, "Bind({portal:?}, {statement:?}, {params:?})"),
            Op::Describe { kind, name } => write!(f, "Describe({}, {name:?})", *kind as char),
            Op::Execute { portal, max_rows } => write!(f, "Execute({portal:?}, {max_rows})"),
            Op::Close { kind, name } => write!(f, "Close({}, {name:?})", *kind as char),
            Op::Sync => write!(f, "Sync"),
            Op::Flush => write!(f, "Flush"),
        }
    }
}

/// What one client sends in one write; it waits for every ReadyForQuery the step asks for.
#[derive(Clone, Debug)]
pub struct Step {
    pub who: Who,
    pub ops: Vec<Op>,
}

impl Step {
    pub fn bytes(&self) -> Vec<u8> {
        self.ops.iter().flat_map(Op::encode).collect()
    }

    pub fn readies(&self) -> usize {
        self.ops.iter().filter(|o| o.ends_with_ready()).count()
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}:", self.who)?;
        for op in &self.ops {
            write!(f, " {op}")?;
        }
        Ok(())
    }
}

/// The script as Rust-like text, to paste into a regression test.
pub fn listing(steps: &[Step]) -> String {
    steps
        .iter()
        .enumerate()
        .map(|(n, s)| format!("{n:>3} {s}\n"))
        .collect()
}
