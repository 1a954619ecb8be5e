//! Session commands under transaction pooling: what a query text means for state that outlives
//! its transaction. Most texts mean nothing (a cheap prefilter says so without parsing); the
//! rest are parsed and planned: `SET`s are tracked, SQL-level `PREPARE`/`EXECUTE`/`DEALLOCATE`
//! are mapped onto pgmemo's server-side statements, `DISCARD ALL` acts on the client's view,
//! and features that would leak between clients sharing a server (`LISTEN`, `WITH HOLD`
//! cursors, session advisory locks, temporary tables, `SET ROLE`) are refused.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use sql::{SetCommand, SetValue, StatementInfo, StatementKind};
use wire::ErrorResponse;

use super::link::ClientState;
use crate::pool::settings::{
    quote_literal, set_raw_in_block, set_sql, ClientSettings, SettingChange, TrackedChange,
    UNKNOWN_PARSE_SETTINGS,
};
use crate::pool::{
    ParamTypes, PreparedStatement, ServerStatements, Sharing, StatementKey, StatementRegistry,
    StatementSource,
};

/// A statement that runs on the server but does nothing; its command tag is replaced by the
/// one the client expects.
pub const NO_OP: &str = "DO $pgmemo$BEGIN END$pgmemo$";

/// SQLSTATEs PostgreSQL uses for the errors pgmemo raises in its place.
const DUPLICATE_PSTATEMENT: &str = "42P05";
use wire::sqlstate::INVALID_SQL_STATEMENT_NAME;
const ACTIVE_SQL_TRANSACTION: &str = "25001";

/// Which protocol carried the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Simple,
    /// A Parse; `named` for a named statement, which may run much later on another server.
    Extended {
        named: bool,
    },
}

/// What pgmemo does for each statement once the server answered it.
#[derive(Debug, Clone)]
pub enum Effect {
    None,
    /// A setting changed (counted when the transaction commits).
    Setting(TrackedChange),
    /// Several, in order (`RESET ALL` of a client with startup settings: everything back to
    /// the server's defaults, then the client's startup values set again).
    Settings(Vec<TrackedChange>),
    /// Settings changed in a way pgmemo cannot replay (`set_config`, `DO`, `CALL`). `verify`:
    /// the settings the text's `set_config` calls name, read back from the server once the
    /// client's transaction is over (`ClientState::verify`), so that their values follow the
    /// client as PostgreSQL's session keeps them.
    SettingsUnknown {
        verify: Vec<String>,
    },
    /// A setting changed for the transaction only (`SET LOCAL`, `SET LOCAL ROLE`): nothing to
    /// replay, but the server reports the change (and its undoing) for that setting, or for
    /// several when `None` (a role changes `is_superuser` and `session_authorization`).
    LocalSetting(Option<String>),
    /// A statement was prepared for the client: undone if the statement fails, on the
    /// server too when this statement was to create it there (`created`; otherwise the
    /// server holds it already and keeps it).
    ///
    /// `ran` is set by the first Execute of a portal of the statement (an unnamed one, bound
    /// again and again): a later one finds the name taken, as PostgreSQL would.
    Prepared {
        statement: Arc<PreparedStatement>,
        client_name: String,
        created: bool,
        ran: Arc<AtomicBool>,
    },
    /// Statement names were dropped from the client's view (`DEALLOCATE`, `Close`): given
    /// back if the server skipped the statement (an error before it, an aborted block), as
    /// PostgreSQL then keeps them.
    Deallocated(Vec<(String, Arc<PreparedStatement>)>),
    /// `DISCARD ALL`: the client's statements dropped at once (given back, as for
    /// `Deallocated`, if the server skipped it) and its settings reset once it completes.
    Discarded {
        statements: Vec<(String, Arc<PreparedStatement>)>,
        reset: TrackedChange,
    },
    /// The statement is a `DO` block raising an error in place of the client's (a refusal
    /// PostgreSQL reports when the statement runs): the error reaches the client without the
    /// PL/pgSQL context line, as PostgreSQL itself would report it.
    Raises,
}

impl Effect {
    /// Whether the statement changes session settings (for the session or its transaction),
    /// among them those under which the server analyses statements prepared after it.
    pub fn changes_settings(&self) -> bool {
        matches!(
            self,
            Effect::Setting(_)
                | Effect::Settings(_)
                | Effect::SettingsUnknown { .. }
                | Effect::LocalSetting(_)
                | Effect::Discarded { .. }
        )
    }
}

/// One statement's effect and the command tag to show instead of the server's.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub effect: Effect,
    pub tag: Option<&'static str>,
    /// pgmemo's server-side statement that the statement runs (`EXECUTE`, `EXPLAIN EXECUTE`,
    /// `CREATE TABLE ... AS EXECUTE`): when its plan went stale or it vanished from the
    /// server, it is forgotten there, as after a failed Bind of it.
    pub uses: Option<Arc<PreparedStatement>>,
}

/// The command tag of `DEALLOCATE ALL`, which tells its outcome from one of `DEALLOCATE name`.
const DEALLOCATE_ALL: &str = "DEALLOCATE ALL";

impl Outcome {
    /// `DEALLOCATE ALL` or `DISCARD ALL`: running, it drops every name the client has then,
    /// also one given back after it was planned (`Link::give_back`).
    pub fn drops_every_name(&self) -> bool {
        self.tag == Some(DEALLOCATE_ALL) || matches!(self.effect, Effect::Discarded { .. })
    }

    fn plain() -> Outcome {
        Outcome {
            effect: Effect::None,
            tag: None,
            uses: None,
        }
    }

    /// See [`Effect::Raises`].
    pub fn raises() -> Outcome {
        Outcome {
            effect: Effect::Raises,
            ..Outcome::plain()
        }
    }
}

/// Work on the server before the client's statement can run there.
#[derive(Debug, Clone)]
pub enum ServerPrep {
    /// Prepare the statement (under the settings of its first reading,
    /// `settings::analysis_switch`).
    Create(Arc<PreparedStatement>),
    Drop(Arc<PreparedStatement>),
}

/// The plan for one query text.
#[derive(Debug)]
pub enum Plan {
    /// Nothing to do: forward as is.
    Plain,
    /// Rewrite, prepare, and track.
    Tracked {
        text: Option<String>,
        outcomes: Vec<Outcome>,
        prep: Vec<ServerPrep>,
        /// A statement after the first was refused: the text ends with the raise.
        raises: bool,
    },
    /// Raise this error on the server instead (so the transaction fails as it would have).
    Refused(ErrorResponse),
}

/// The state a plan reads and changes.
pub struct Planner<'a> {
    pub registry: &'a StatementRegistry,
    /// The client's names and settings: its startup values are what `RESET` returns to.
    pub state: &'a mut ClientState,
    pub server: &'a mut ServerStatements,
    pub max_prepared: usize,
    /// The client is inside a transaction block.
    pub in_block: bool,
    /// The settings the server analyses statements under may differ from the client's
    /// records before the text: its open transaction changed some (committed only at its
    /// end), or a statement pipelined ahead whose answer has not come (`Link::settings_unsettled`).
    pub settings_changed: bool,
    /// What the statements of the text planned so far did to the settings the next one runs
    /// under ([`Self::plan`] keeps it; start with the default).
    pub at_use: SettingsAtUse,
}

/// The settings the next statement of a text runs under, as far as the statements before it
/// in the same text tell: an `EXECUTE` behind a `set_config` in one Query runs under settings
/// pgmemo learns only from the answer.
#[derive(Debug, Default)]
pub enum SettingsAtUse {
    /// No statement before it changed them.
    #[default]
    Committed,
    /// Changed by statements pgmemo follows (`SET`): these.
    Followed(ClientSettings),
    /// Changed in a way pgmemo cannot follow (`set_config`, `DO`, `CALL`).
    Unfollowed,
}

impl SettingsAtUse {
    /// The settings after a statement with `effect`, one that changes settings, ran under
    /// `self`; `committed`: the client's settings before the text.
    fn after(self, effect: &Effect, committed: &ClientSettings) -> SettingsAtUse {
        match (effect, self) {
            (Effect::Setting(c), SettingsAtUse::Committed) if c.real => {
                SettingsAtUse::Followed(committed.after(&c.change))
            }
            (Effect::Setting(c), SettingsAtUse::Followed(settings)) if c.real => {
                SettingsAtUse::Followed(settings.after(&c.change))
            }
            _ => SettingsAtUse::Unfollowed,
        }
    }
}

impl Planner<'_> {
    /// A `PREPARE` of a name the client has: what runs in its place. PostgreSQL analyses the
    /// statement before it looks the name up, so a statement with an error of its own (a
    /// missing table, a type mismatch) fails with that error, and only then with 42P05: the
    /// server prepares it under a name of pgmemo's, drops it again and raises the duplicate.
    fn duplicate_prepare(&self, stmt: &StatementInfo) -> Option<String> {
        let StatementKind::Prepare {
            name,
            param_types,
            statement,
        } = &stmt.kind
        else {
            return None;
        };
        if !self.state.statements.contains_key(name) {
            return None;
        }
        let types = if param_types.is_empty() {
            String::new()
        } else {
            format!(" ({})", param_types.join(", "))
        };
        let probe = format!("PREPARE {PROBE_STATEMENT}{types} AS {}", statement.text);
        Some(raise_after_sql(
            &[&probe, &format!("DEALLOCATE {PROBE_STATEMENT}")],
            &duplicate(name),
        ))
    }

    /// Plans `text`. Statements the analysis cannot parse are forwarded as they are: the
    /// server reports the syntax error.
    pub fn plan(&mut self, text: &[u8], protocol: Protocol) -> Plan {
        self.server.pin_uses();
        let plan = self.plan_pinned(text, protocol);
        self.server.unpin();
        plan
    }

    /// [`Self::plan`] while the statements it gets prepared are pinned on the server.
    fn plan_pinned(&mut self, text: &[u8], protocol: Protocol) -> Plan {
        if !sql::may_affect_session(text) {
            return Plan::Plain;
        }
        // Text that is not UTF-8 (a client_encoding such as LATIN1): the analysis cannot read
        // it, and what it would change cannot be replayed as pgmemo writes it (in UTF-8).
        let Ok(text) = std::str::from_utf8(text) else {
            return Plan::Refused(not_utf8());
        };
        let Ok(analysis) = sql::analyze(text) else {
            return Plan::Plain;
        };
        let many = analysis.statements.len() > 1;
        if many && matches!(protocol, Protocol::Extended { .. }) {
            // PostgreSQL refuses a Parse of several statements (42601) before looking at
            // any of them: the server says so, not a refusal of pgmemo's about one of them.
            return Plan::Plain;
        }
        let mut outcomes = Vec::with_capacity(analysis.statements.len());
        let mut prep = Vec::new();
        let mut pieces: Vec<(std::ops::Range<usize>, String)> = Vec::new();
        let mut raises = false;
        for (i, stmt) in analysis.statements.iter().enumerate() {
            if protocol != (Protocol::Extended { named: true }) {
                if let Some(raise) = self.duplicate_prepare(stmt) {
                    // The statements before it run, as in PostgreSQL; nothing after it does.
                    pieces.push((stmt.source.start..text.len(), raise));
                    outcomes.push(Outcome::raises());
                    raises = true;
                    break;
                }
            }
            let planned =
                refusal(stmt).and_then(|()| self.statement(stmt, protocol, many, &mut prep));
            let (outcome, replacement) = match planned {
                Ok(v) => v,
                Err(e) if i == 0 => return Plan::Refused(e),
                Err(e) => {
                    // The statements before it run, as in PostgreSQL; nothing after it does.
                    pieces.push((stmt.source.start..text.len(), raise_sql(&e)));
                    outcomes.push(Outcome::raises());
                    raises = true;
                    break;
                }
            };
            if let Some(r) = replacement {
                pieces.push((stmt.source.clone(), r));
            }
            if outcome.effect.changes_settings() {
                let before = std::mem::take(&mut self.at_use);
                self.at_use = before.after(&outcome.effect, &self.state.settings);
            }
            outcomes.push(outcome);
        }
        let untracked = outcomes
            .iter()
            .all(|o| matches!(o.effect, Effect::None) && o.tag.is_none());
        if untracked && pieces.is_empty() && prep.is_empty() {
            return Plan::Plain;
        }
        let text = (!pieces.is_empty()).then(|| splice(text, &pieces));
        Plan::Tracked {
            text,
            outcomes,
            prep,
            raises,
        }
    }

    /// Whether the server may analyse a statement prepared now under other settings than the
    /// client's records show: see [`Self::settings_changed`] and [`Self::at_use`].
    fn settings_unsettled(&self) -> bool {
        self.settings_changed || !matches!(self.at_use, SettingsAtUse::Committed)
    }

    /// The client's statement `name` for an `EXECUTE`: a copy of its own when its settings
    /// moved since it prepared a shared one (`ClientState::own_copy_of`), unless planning
    /// cannot tell the settings the server analyses under (the open transaction changed
    /// them). Behind a change earlier in the same text that pgmemo cannot follow
    /// (`set_config('TimeZone', ...)`) a shared statement is always copied: the copy is
    /// prepared before the text runs, under the settings the statement was registered for,
    /// and reads as the client's own statement in PostgreSQL whatever the change turns out
    /// to be.
    fn statement_to_run(&mut self, name: &str) -> Result<Arc<PreparedStatement>, ErrorResponse> {
        let statement = self
            .state
            .statements
            .get(name)
            .ok_or_else(|| missing(name))?;
        let statement = Arc::clone(statement);
        let copy = !self.settings_changed
            && match &self.at_use {
                SettingsAtUse::Committed => {
                    statement.drifted_from(self.state.settings.parse_digest())
                }
                SettingsAtUse::Followed(settings) => {
                    statement.drifted_from(settings.parse_digest())
                }
                SettingsAtUse::Unfollowed => statement.sharing == Sharing::Shared,
            };
        if !copy {
            return Ok(statement);
        }
        Ok(self.state.own_copy_of(name, &statement, self.registry))
    }

    fn ensure(&mut self, statement: &Arc<PreparedStatement>, prep: &mut Vec<ServerPrep>) {
        ensure_on(self.server, self.max_prepared, statement, prep);
    }

    fn statement(
        &mut self,
        stmt: &StatementInfo,
        protocol: Protocol,
        many: bool,
        prep: &mut Vec<ServerPrep>,
    ) -> Result<(Outcome, Option<String>), ErrorResponse> {
        let sql_level = matches!(
            stmt.kind,
            StatementKind::Prepare { .. }
                | StatementKind::Execute { .. }
                | StatementKind::Deallocate { .. }
                | StatementKind::Discard(sql::DiscardKind::All)
        );
        let sql_level = sql_level || stmt.executes.is_some();
        if sql_level && protocol == (Protocol::Extended { named: true }) {
            return Err(unsupported(
                "PREPARE, EXECUTE, DEALLOCATE and DISCARD ALL in a named protocol-level \
                 statement are not supported in transaction pooling",
                "Send them with the simple query protocol or as unnamed statements.",
            ));
        }
        if let Some(executes) = &stmt.executes {
            return self.wrapped_execute(stmt, executes, prep);
        }
        match &stmt.kind {
            StatementKind::Set(set) => Ok(match reset_to_startup(set, &self.state.settings) {
                Some(rewritten) => rewritten,
                None => (setting(set)?, None),
            }),
            StatementKind::Prepare {
                name,
                param_types,
                statement,
            } => {
                if self.state.statements.contains_key(name) {
                    return Err(ErrorResponse::error(
                        DUPLICATE_PSTATEMENT,
                        format!("prepared statement \"{name}\" already exists"),
                    ));
                }
                let key = StatementKey {
                    text: statement.text.as_str().into(),
                    types: ParamTypes::Sql(param_types.clone().into_boxed_slice()),
                    settings: if self.settings_unsettled() {
                        Arc::from(UNKNOWN_PARSE_SETTINGS)
                    } else {
                        self.state.settings.parse_digest().clone()
                    },
                };
                let types = if param_types.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", param_types.join(", "))
                };
                let create = |server_name: &str| {
                    StatementSource::Sql(format!(
                        "PREPARE {server_name}{types} AS {}",
                        statement.text
                    ))
                };
                let prepared = if self.settings_unsettled() {
                    self.registry.register_unshared(key, create)
                } else {
                    self.registry.get_or_register(key, create)
                };
                self.state.statements.insert(name.clone(), prepared.clone());
                if self.server.touch(&prepared) {
                    return Ok((
                        Outcome {
                            effect: Effect::Prepared {
                                statement: prepared,
                                client_name: name.clone(),
                                created: false,
                                ran: Arc::default(),
                            },
                            tag: Some("PREPARE"),
                            uses: None,
                        },
                        Some(NO_OP.to_owned()),
                    ));
                }
                let evicted = self.server.insert(prepared.clone(), self.max_prepared);
                prep.extend(evicted.into_iter().map(ServerPrep::Drop));
                let StatementSource::Sql(create) = &prepared.create else {
                    unreachable!("SQL-level statements are created with SQL")
                };
                let create = create.clone();
                Ok((
                    Outcome {
                        effect: Effect::Prepared {
                            statement: prepared,
                            client_name: name.clone(),
                            created: true,
                            ran: Arc::default(),
                        },
                        tag: None,
                        uses: None,
                    },
                    Some(create),
                ))
            }
            StatementKind::Execute { name, params } => {
                let prepared = self.statement_to_run(name)?;
                self.ensure(&prepared, prep);
                let args = if params.is_empty() {
                    String::new()
                } else {
                    format!("({})", params.join(", "))
                };
                Ok((
                    executed(&prepared),
                    Some(format!("EXECUTE {}{args}", prepared.name)),
                ))
            }
            StatementKind::Deallocate { name: Some(name) } => {
                let statement = self
                    .state
                    .statements
                    .remove(name)
                    .ok_or_else(|| missing(name))?;
                dropped(vec![(name.clone(), statement)], "DEALLOCATE")
            }
            StatementKind::Deallocate { name: None } => {
                let all = std::mem::take(&mut self.state.statements)
                    .into_iter()
                    .collect();
                dropped(all, DEALLOCATE_ALL)
            }
            StatementKind::Discard(sql::DiscardKind::All) => {
                if self.in_block || many {
                    return Err(ErrorResponse::error(
                        ACTIVE_SQL_TRANSACTION,
                        "DISCARD ALL cannot run inside a transaction block",
                    ));
                }
                Ok((
                    Outcome {
                        effect: Effect::Discarded {
                            statements: std::mem::take(&mut self.state.statements)
                                .into_iter()
                                .collect(),
                            reset: TrackedChange {
                                change: SettingChange::ResetAll,
                                real: false,
                            },
                        },
                        tag: Some("DISCARD ALL"),
                        uses: None,
                    },
                    // DISCARD ALL closes every portal, the one running it too (a second
                    // Execute of it fails with 34000): so does CLOSE ALL. Outside a block
                    // the server's portals are all this client's.
                    Some("CLOSE ALL".to_owned()),
                ))
            }
            // Their code may run SET (it persists once the transaction commits), which
            // pgmemo cannot follow: the server is reset before its next use.
            StatementKind::Do | StatementKind::Call => Ok((
                Outcome {
                    effect: Effect::SettingsUnknown { verify: Vec::new() },
                    tag: None,
                    uses: None,
                },
                None,
            )),
            _ if calls_set_config(stmt) => Ok((
                Outcome {
                    effect: Effect::SettingsUnknown {
                        verify: stmt.set_config_names.clone().unwrap_or_default(),
                    },
                    tag: None,
                    uses: None,
                },
                None,
            )),
            _ => Ok((Outcome::plain(), None)),
        }
    }
}

impl Planner<'_> {
    /// `EXPLAIN EXECUTE name` or `CREATE TABLE ... AS EXECUTE name`: the client's statement
    /// of that name, under pgmemo's name on the server.
    fn wrapped_execute(
        &mut self,
        stmt: &StatementInfo,
        executes: &sql::ExecuteRef,
        prep: &mut Vec<ServerPrep>,
    ) -> Result<(Outcome, Option<String>), ErrorResponse> {
        let prepared = self.statement_to_run(&executes.name)?;
        let name = executes
            .name_range
            .as_ref()
            .and_then(|r| {
                let start = r.start.checked_sub(stmt.source.start)?;
                let end = r.end.checked_sub(stmt.source.start)?;
                Some((stmt.text.get(..start)?, stmt.text.get(end..)?))
            })
            .ok_or_else(|| {
                unsupported(
                    "pgmemo cannot find the statement name in this EXECUTE",
                    "Write it as EXECUTE name on its own.",
                )
            })?;
        self.ensure(&prepared, prep);
        let text = format!("{}{}{}", name.0, prepared.name, name.1);
        Ok((executed(&prepared), Some(text)))
    }
}

/// What running a SQL-level prepared statement does: it runs pgmemo's statement on the server,
/// and it changes settings when its text calls `set_config` (analysed when it was prepared,
/// but such calls change settings only when it runs).
fn executed(statement: &Arc<PreparedStatement>) -> Outcome {
    let text = &*statement.key.text;
    let effect = if !sql::may_affect_session(text) {
        Effect::None
    } else {
        match sql::analyze(text) {
            Ok(a) if !a.statements.iter().any(calls_set_config) => Effect::None,
            Ok(a) => Effect::SettingsUnknown {
                verify: a
                    .statements
                    .iter()
                    .flat_map(|s| s.set_config_names.clone().unwrap_or_default())
                    .collect(),
            },
            Err(_) => Effect::SettingsUnknown { verify: Vec::new() },
        }
    };
    Outcome {
        effect,
        tag: None,
        uses: Some(Arc::clone(statement)),
    }
}

/// Whether a statement calls `set_config`, which changes settings pgmemo cannot replay.
fn calls_set_config(stmt: &StatementInfo) -> bool {
    stmt.functions.iter().any(|f| f.name == "set_config")
}

/// Makes sure `server` has `statement`, noting what to create and close first.
pub fn ensure_on(
    server: &mut ServerStatements,
    max_prepared: usize,
    statement: &Arc<PreparedStatement>,
    prep: &mut Vec<ServerPrep>,
) {
    if server.touch(statement) {
        return;
    }
    let evicted = server.insert(statement.clone(), max_prepared);
    prep.extend(evicted.into_iter().map(ServerPrep::Drop));
    prep.push(ServerPrep::Create(statement.clone()));
}

/// The outcome of a `DEALLOCATE` pgmemo answers itself (the server runs a no-op in its place,
/// so that it fails or is skipped where the real one would).
fn dropped(
    statements: Vec<(String, Arc<PreparedStatement>)>,
    tag: &'static str,
) -> Result<(Outcome, Option<String>), ErrorResponse> {
    Ok((
        Outcome {
            effect: Effect::Deallocated(statements),
            tag: Some(tag),
            uses: None,
        },
        Some(NO_OP.to_owned()),
    ))
}

/// The error PostgreSQL gives for an unknown statement name.
pub fn missing(name: &str) -> ErrorResponse {
    if name.is_empty() {
        return ErrorResponse::error(
            INVALID_SQL_STATEMENT_NAME,
            "unnamed prepared statement does not exist",
        );
    }
    ErrorResponse::error(
        INVALID_SQL_STATEMENT_NAME,
        format!("prepared statement \"{name}\" does not exist"),
    )
}

/// The error PostgreSQL gives for a statement name used twice.
pub fn duplicate(name: &str) -> ErrorResponse {
    ErrorResponse::error(
        DUPLICATE_PSTATEMENT,
        format!("prepared statement \"{name}\" already exists"),
    )
}

/// `RESET` (and `SET ... TO DEFAULT`) of settings the client's startup packet gave: on a
/// direct connection they return to those values, the session defaults. A pooled server's
/// defaults are the server's own, so the statement is rewritten to set the client's values
/// (after `RESET ALL` for that one), in a `DO` block that answers like the original (tag
/// restored). `None`: the statement needs no rewriting.
fn reset_to_startup(
    set: &SetCommand,
    settings: &ClientSettings,
) -> Option<(Outcome, Option<String>)> {
    let (changes, body, tag) = match set {
        SetCommand::Default { local: false, name } | SetCommand::Reset { name } => {
            let (_, sql) = settings.startup().find(|(n, _)| *n == name)?;
            let change = TrackedChange {
                change: SettingChange::Set(name.clone(), sql.clone()),
                real: true,
            };
            let tag = if matches!(set, SetCommand::Reset { .. }) {
                "RESET"
            } else {
                "SET"
            };
            (vec![change], set_raw_in_block(sql)?, tag)
        }
        SetCommand::ResetAll => {
            let mut changes = vec![TrackedChange {
                change: SettingChange::ResetAll,
                real: true,
            }];
            let mut body = String::from("RESET ALL;");
            for (name, sql) in settings.startup() {
                body.push_str(&set_raw_in_block(sql)?);
                changes.push(TrackedChange {
                    change: SettingChange::Set(name.clone(), sql.clone()),
                    real: true,
                });
            }
            if changes.len() == 1 {
                return None;
            }
            (changes, body, "RESET")
        }
        _ => return None,
    };
    if body.contains("$pgmemo$") {
        return None;
    }
    let effect = match <[TrackedChange; 1]>::try_from(changes) {
        Ok([one]) => Effect::Setting(one),
        Err(many) => Effect::Settings(many),
    };
    Some((
        Outcome {
            effect,
            tag: Some(tag),
            uses: None,
        },
        Some(format!("DO $pgmemo$BEGIN {body} END$pgmemo$")),
    ))
}

fn setting(set: &SetCommand) -> Result<Outcome, ErrorResponse> {
    if let SetCommand::Assign { name, values, .. } = set {
        let temp = |v: &SetValue| matches!(v, SetValue::Text(t) if names_temp_schema(t));
        if name == "search_path" && values.iter().any(temp) {
            return Err(temp_search_path());
        }
    }
    let tracked = |change| Outcome {
        effect: Effect::Setting(TrackedChange { change, real: true }),
        tag: None,
        uses: None,
    };
    Ok(match set {
        SetCommand::Assign {
            local: false,
            name,
            values,
        } => {
            let values: Vec<String> = values.iter().map(|v| v.to_sql()).collect();
            tracked(SettingChange::Set(
                name.clone(),
                set_sql(name, &values.join(", ")),
            ))
        }
        SetCommand::Default { local: false, name } | SetCommand::Reset { name } => {
            tracked(SettingChange::Reset(name.clone()))
        }
        SetCommand::ResetAll => tracked(SettingChange::ResetAll),
        SetCommand::FromCurrent { local: false, .. } => {
            return Err(unsupported(
                "SET ... FROM CURRENT is not supported in transaction pooling",
                "Set the value explicitly.",
            ))
        }
        SetCommand::Role {
            local: false,
            role: Some(_),
        }
        | SetCommand::SessionAuthorization {
            local: false,
            user: Some(_),
        } => {
            return Err(unsupported(
                "SET ROLE and SET SESSION AUTHORIZATION are not supported in transaction pooling",
                "Use SET LOCAL ROLE inside a transaction, or connect as that role.",
            ))
        }
        SetCommand::SessionCharacteristics(_) => {
            return Err(unsupported(
                "SET SESSION CHARACTERISTICS is not supported in transaction pooling",
                "Use SET default_transaction_isolation (and friends) instead.",
            ))
        }
        SetCommand::Assign { name, .. }
        | SetCommand::Default { name, .. }
        | SetCommand::FromCurrent { name, .. } => Outcome {
            effect: Effect::LocalSetting(Some(name.clone())),
            tag: None,
            uses: None,
        },
        SetCommand::Role { .. } | SetCommand::SessionAuthorization { .. } => Outcome {
            effect: Effect::LocalSetting(None),
            tag: None,
            uses: None,
        },
        SetCommand::Transaction(_) | SetCommand::TransactionSnapshot { .. } => Outcome::plain(),
    })
}

/// Session-only features: they would outlive the transaction on a server that other clients
/// use next.
fn refusal(stmt: &StatementInfo) -> Result<(), ErrorResponse> {
    let refuse = |what: &str, hint: &str| {
        Err(unsupported(
            &format!("{what} is not supported in transaction pooling"),
            hint,
        ))
    };
    match &stmt.kind {
        // What the statement would do when executed is refused when it is prepared.
        StatementKind::Prepare { statement, .. } => refusal(statement)?,
        StatementKind::Listen { .. } => {
            return refuse(
                "LISTEN",
                "Use a pgmemo database with pool_mode = session for notifications.",
            )
        }
        StatementKind::DeclareCursor { hold: true, .. } => {
            return refuse(
                "DECLARE ... WITH HOLD",
                "Declare the cursor without WITH HOLD inside a transaction.",
            )
        }
        _ => {}
    }
    if stmt.session_temp_table {
        return refuse(
            "a temporary table that outlives its transaction",
            "Create it with ON COMMIT DROP inside a transaction.",
        );
    }
    if stmt.functions.iter().any(|f| {
        matches!(
            f.name.as_str(),
            "pg_advisory_lock"
                | "pg_advisory_lock_shared"
                | "pg_try_advisory_lock"
                | "pg_try_advisory_lock_shared"
        )
    }) {
        return refuse(
            "a session-level advisory lock",
            "Use pg_advisory_xact_lock (released at the end of the transaction).",
        );
    }
    Ok(())
}

/// Whether a `search_path` element is the session's temporary schema: with it in the path,
/// `CREATE TABLE t` can make a temporary table without saying so.
pub fn names_temp_schema(element: &str) -> bool {
    element.starts_with("pg_temp")
}

/// A statement pgmemo must read but cannot: one that may change session state, or a named
/// prepared statement (its text keys the statements shared between clients), whose bytes are
/// not UTF-8. Statements that need none of that (most queries) go to the server as they are
/// in any `client_encoding`.
pub fn not_utf8() -> ErrorResponse {
    unsupported(
        "in transaction pooling, statements that may change session state and prepared \
         statement names and texts must be valid UTF-8",
        "Use client_encoding UTF8 for such statements, or send the statement unnamed or as a \
         simple query.",
    )
}

/// PostgreSQL's refusal of a `DISCARD ALL` executed after another statement of the same
/// extended-protocol batch (before its Sync): it must commit at once, which would commit the
/// statements before it too.
pub fn discard_in_pipeline() -> ErrorResponse {
    ErrorResponse::error(
        ACTIVE_SQL_TRANSACTION,
        "DISCARD ALL cannot be executed within a pipeline",
    )
}

/// The refusal of an execution of a `PREPARE`, `DEALLOCATE` or `DISCARD ALL` parsed as the
/// unnamed statement in an earlier batch than the one executing it: pgmemo withdrew what it
/// would change at that batch's Sync, and cannot tell on which server it would now run.
pub fn run_late() -> ErrorResponse {
    unsupported(
        "in transaction pooling, a PREPARE, DEALLOCATE or DISCARD ALL sent as an unnamed \
         protocol-level statement must be executed in the batch that parses it",
        "Send the statement as a simple query, or parse, bind and execute it before one Sync.",
    )
}

/// The refusal of a `search_path` naming `pg_temp` (by `SET` or at login).
pub fn temp_search_path() -> ErrorResponse {
    unsupported(
        "a search_path naming pg_temp is not supported in transaction pooling",
        "Objects created in pg_temp would outlive the transaction on a shared server \
         connection; leave pg_temp out of search_path.",
    )
}

fn unsupported(message: &str, hint: &str) -> ErrorResponse {
    ErrorResponse::error(wire::sqlstate::FEATURE_NOT_SUPPORTED, message).with_hint(hint)
}

/// `text` with each range replaced, ranges in ascending order.
fn splice(text: &str, pieces: &[(std::ops::Range<usize>, String)]) -> String {
    let mut out = String::with_capacity(text.len() + 32);
    let mut at = 0;
    for (range, replacement) in pieces {
        out.push_str(&text[at..range.start]);
        out.push_str(replacement);
        at = range.end;
    }
    out.push_str(&text[at..]);
    out
}

/// A statement that makes the server raise `error`, so the client's transaction fails exactly
/// as if PostgreSQL had refused the statement itself.
pub fn raise_sql(error: &ErrorResponse) -> String {
    raise_after_sql(&[], error)
}

/// The server-side name under which a duplicate `PREPARE`'s statement is analysed (see
/// `Planner::duplicate_prepare`): no client's statement maps to it.
const PROBE_STATEMENT: &str = "pgmemo_probe";

/// Like [`raise_sql`], after running `first` (statements whose own errors come first).
fn raise_after_sql(first: &[&str], error: &ErrorResponse) -> String {
    let lit = quote_literal;
    let mut body = String::from("BEGIN ");
    for sql in first {
        body.push_str(&format!("EXECUTE {}; ", lit(sql)));
    }
    body.push_str(&format!(
        "RAISE EXCEPTION USING ERRCODE = {}, MESSAGE = {}",
        lit(&error.code),
        lit(&error.message)
    ));
    if let Some(hint) = &error.hint {
        body.push_str(&format!(", HINT = {}", lit(hint)));
    }
    body.push_str("; END");
    let mut tag = "$pgmemo$".to_owned();
    while body.contains(&tag) {
        tag.insert(tag.len() - 1, 'x');
    }
    format!("DO {tag}{body}{tag}")
}
