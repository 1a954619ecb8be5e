//! SQLSTATE codes pgmemo itself reports, named as in PostgreSQL's errcodes.txt so that clients
//! and operators see the codes they already handle.

pub const PROTOCOL_VIOLATION: &str = "08P01";
pub const CONNECTION_FAILURE: &str = "08006";
pub const CONNECTION_EXCEPTION: &str = "08000";
pub const SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION: &str = "08001";
pub const INVALID_PASSWORD: &str = "28P01";
pub const INVALID_AUTHORIZATION_SPECIFICATION: &str = "28000";
pub const INVALID_CATALOG_NAME: &str = "3D000";
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
pub const CHARACTER_NOT_IN_REPERTOIRE: &str = "22021";
pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
pub const TOO_MANY_CONNECTIONS: &str = "53300";
pub const ADMIN_SHUTDOWN: &str = "57P01";
pub const CANNOT_CONNECT_NOW: &str = "57P03";
pub const QUERY_CANCELED: &str = "57014";
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
pub const SYNTAX_ERROR: &str = "42601";
pub const PROGRAM_LIMIT_EXCEEDED: &str = "54000";
pub const INTERNAL_ERROR: &str = "XX000";
pub const IDLE_IN_TRANSACTION_SESSION_TIMEOUT: &str = "25P03";
pub const CONFIG_FILE_ERROR: &str = "F0000";
