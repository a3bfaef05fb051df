//! Attaching to a running sandbox by name (`sifbox exec`, `stop`, `cp`).

use std::cell::{Cell, RefCell};

use rustix::process::Pid;

use super::{Evidencing, Sandbox, SandboxError};
use crate::error::Result;
use crate::protocol::Request;
use crate::runtime;
use crate::spec::validate_name;

impl Sandbox {
    /// A round trip through the control socket.
    pub fn ping(&self) -> Result<()> {
        self.request(&Request::Ping, &[]).map(drop)
    }

    /// Opens a running sandbox by name (started by another process) to run
    /// commands in it or copy files; a one-shot `run` is refused.
    pub fn attach(name: &str) -> Result<Sandbox> {
        Sandbox::attach_inner(name, false)
    }

    /// Opens a running sandbox by name to stop it; one-shot runs included.
    pub fn attach_to_stop(name: &str) -> Result<Sandbox> {
        Sandbox::attach_inner(name, true)
    }

    fn attach_inner(name: &str, any: bool) -> Result<Sandbox> {
        validate_name(name)?;
        let root = runtime::root()?;
        let dir = runtime::sandbox_dir(&root, name);
        let state = runtime::read_state(&dir)
            .ok_or_else(|| SandboxError::NoSuchSandbox(name.to_string()))?;
        if !runtime::is_alive(&state) {
            return Err(SandboxError::SupervisorGone(name.to_string()).into());
        }
        if state.oneshot && !any {
            return Err(SandboxError::OneShot(name.to_string()).into());
        }
        let pid = Pid::from_raw(state.supervisor_pid)
            .ok_or_else(|| SandboxError::BadState(name.to_string()))?;
        Ok(Sandbox {
            reservation: RefCell::new(None),
            control: None,
            name: name.to_string(),
            dir,
            supervisor: Some(pid),
            status: RefCell::new(None),
            ready: Cell::new(true),
            ready_time_ns: Cell::new(0),
            is_child: false,
            evidence: RefCell::new(match state.evidence {
                Some(p) => Evidencing::Written(root.reach(&p)),
                None => Evidencing::None,
            }),
            stop_inside_ns: Cell::new(0),
            stopping: Cell::new(false),
            stop_asked: Cell::new(false),
            denied: RefCell::new(Vec::new()),
            limits: state.limits,
        })
    }
}
