//! Detached execs (`exec --detach`): started, then listed, waited for,
//! signalled and read back from their files in the runtime dir.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use super::{ExecStatus, Sandbox, SandboxError};
use crate::error::{Error, IoContext, Result};
use crate::protocol::{self, Event, ExecRequest, Request};

impl Sandbox {
    /// Starts a command that runs on after this call; its output and exit
    /// status go to files under the runtime dir (`execs/ID/`). Returns the id.
    pub fn exec_detached(&self, req: ExecRequest) -> Result<String> {
        let id = crate::random_id(8);
        let dir = self.dir.join("execs").join(&id);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .ctx(|| format!("creating {}", dir.display()))?;
        let create = |n: &str| {
            std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .mode(0o600)
                .open(dir.join(n))
                .ctx(|| format!("creating {}/{n}", dir.display()))
        };
        let (out, err, status) = (create("stdout")?, create("stderr")?, create("status.json")?);
        let null = File::open("/dev/null").ctx(|| "opening /dev/null".into())?;
        let conn = self.connect()?;
        protocol::send(
            &conn,
            &Request::Exec(ExecRequest {
                tty: false,
                detach_id: Some(id.clone()),
                ..req
            }),
            &[null.as_fd(), out.as_fd(), err.as_fd(), status.as_fd()],
        )
        .map_err(|e| self.proto(e))?;
        Ok(id)
    }

    /// The files of a detached exec: (stdout, stderr, status.json).
    pub fn detached_files(&self, id: &str) -> Result<(PathBuf, PathBuf, PathBuf)> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(SandboxError::BadExecId(id.to_string()).into());
        }
        let dir = self.dir.join("execs").join(id);
        if !dir.is_dir() {
            return Err(SandboxError::NoSuchExec {
                id: id.to_string(),
                name: self.name.clone(),
            }
            .into());
        }
        Ok((
            dir.join("stdout"),
            dir.join("stderr"),
            dir.join("status.json"),
        ))
    }

    /// The status of a detached exec, if it has ended.
    pub fn detached_status(&self, id: &str) -> Result<Option<ExecStatus>> {
        let (_, _, status) = self.detached_files(id)?;
        let text = std::fs::read(&status).ctx(|| format!("reading {}", status.display()))?;
        if text.is_empty() {
            return Ok(None);
        }
        let ev: Event = serde_json::from_slice(&text).map_err(|e| Error::Protocol {
            name: self.name.clone(),
            why: format!("malformed {}: {e}", status.display()),
        })?;
        Ok(ExecStatus::from_event(ev))
    }

    /// Waits for a detached exec to end.
    pub fn wait_detached(&self, id: &str) -> Result<ExecStatus> {
        loop {
            if let Some(st) = self.detached_status(id)? {
                return Ok(st);
            }
            if !self.is_running() {
                return Err(Error::Protocol {
                    name: self.name.clone(),
                    why: format!("the sandbox stopped before exec {id} ended"),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Sends `signal` to a detached exec (SIGKILL: to every process it started).
    pub fn signal_detached(&self, id: &str, signal: i32) -> Result<()> {
        self.detached_files(id)?;
        self.request(
            &Request::Signal {
                exec_id: id.to_string(),
                signal,
            },
            &[],
        )
        .map(drop)
    }
}
