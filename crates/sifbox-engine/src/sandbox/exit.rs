//! The end of an exec as the exec server reports it on the exec's
//! connection: the status, the sandbox's clock then, the denied calls.
//! Shared by the exec kinds ([`super::exec`], [`super::relay`]).

use std::os::unix::net::UnixStream;

use super::ExecStatus;
use crate::denials::Denied;
use crate::error::{Error, Result};
use crate::protocol::{self, Event, ProtocolError};

/// The exec's end: its status, the sandbox's clock then, and the calls the
/// default seccomp policy denied during it.
pub(super) fn wait_exit(conn: &UnixStream, name: &str) -> Result<(ExecStatus, u64, Vec<Denied>)> {
    loop {
        match protocol::recv::<Event>(conn) {
            Ok((mut ev, _)) => {
                let (t, denied) = match &mut ev {
                    Event::Exit {
                        time_ns, denied, ..
                    } => (*time_ns, std::mem::take(denied)),
                    _ => (0, Vec::new()),
                };
                if let Some(st) = ExecStatus::from_event(ev) {
                    return Ok((st, t, denied));
                }
            }
            Err(ProtocolError::Closed) => {
                return Err(Error::Protocol {
                    name: name.to_string(),
                    why: "the command ended without an exit status: the sandbox stopped, or something in it killed the process that ran the command".into(),
                })
            }
            Err(e) => {
                return Err(Error::Protocol {
                    name: name.to_string(),
                    why: e.to_string(),
                })
            }
        }
    }
}
