//! Who may connect: the PgBouncer-style userlist and the secrets it holds, used when pgmemo
//! authenticates clients itself (`auth_type = trust | md5 | scram-sha-256`).

mod userlist;

pub use userlist::{Secret, Userlist};
