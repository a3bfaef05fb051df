//! Running commands in an [`AsyncSandbox`]: captured, or spawned with
//! their stdio given as the caller asks.

use std::os::fd::AsFd;
use std::time::Instant;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::net::UnixStream;

use super::process::{drain, read_opt, stdio_ends, Ends, Events, Process, SpawnStdio, Stdio};
use super::{
    blocking, connect, no_tty, proto, stopped_while_running, AioError, AsyncSandbox,
    DEFAULT_MAX_OUTPUT,
};
use crate::error::{Error, IoContext, Result};
use crate::protocol::{self, Event, ExecRequest, Request};
use crate::sandbox::{ExecOutput, ExecStatus, Tail};

impl AsyncSandbox {
    /// Runs `req` with stdin from /dev/null and captures its output (the
    /// last [`DEFAULT_MAX_OUTPUT`] bytes of each stream). The environment is
    /// exactly `req.env` ([`AsyncSandbox::command`] adds the base one).
    ///
    /// Returns once the command has ended, with what it wrote until then;
    /// processes it left running in the background keep running (and
    /// [`AsyncSandbox::stop`] ends them). With `req.timeout_ms`, every
    /// process it started is killed at the timeout and the exit code is 124.
    /// Dropping the future while the command runs kills every process it
    /// started, too.
    ///
    /// ```no_run
    /// use sifbox_engine::protocol::ExecRequest;
    /// # async fn demo(sb: sifbox_engine::aio::AsyncSandbox) -> sifbox_engine::Result<()> {
    /// let out = sb
    ///     .exec(
    ///         ExecRequest::command(["sh", "-c", "make test"])
    ///             .env("PATH", "/usr/bin:/bin")
    ///             .cwd(Some("/src".into()))
    ///             .timeout(Some(std::time::Duration::from_secs(600)))
    ///             .build(),
    ///     )
    ///     .await?;
    /// if out.timed_out {
    ///     eprintln!("timed out; partial output: {}", out.stdout);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecOutput> {
        self.exec_capture(req, None, DEFAULT_MAX_OUTPUT).await
    }

    /// [`AsyncSandbox::exec`] with `stdin` as the command's input and its
    /// own output limit per stream.
    pub async fn exec_capture(
        &self,
        req: ExecRequest,
        stdin: Option<Vec<u8>>,
        max_output: usize,
    ) -> Result<ExecOutput> {
        if req.tty {
            return Err(no_tty());
        }
        let started = Instant::now();
        let stdio = SpawnStdio {
            stdin: if stdin.is_some() {
                Stdio::Piped
            } else {
                Stdio::Null
            },
            stdout: Stdio::Piped,
            stderr: Stdio::Piped,
        };
        let (mut events, ends) = self.send_exec(req, stdio).await?;
        let name = &self.inner.name;
        let Ends {
            stdin: input,
            stdout,
            stderr,
        } = ends;
        let feed = async move {
            if let (Some(mut w), Some(data)) = (input, stdin) {
                // A command that does not read all of it gets EPIPE'd.
                let _ = w.write_all(&data).await;
            }
            std::future::pending::<()>().await;
        };
        let collect = async {
            let (mut out, mut err) = (Tail::new(max_output), Tail::new(max_output));
            let (mut o, mut e) = (stdout, stderr);
            let (mut ob, mut eb) = (vec![0u8; 16384], vec![0u8; 16384]);
            let mut denied = Vec::new();
            let status = loop {
                tokio::select! {
                    r = read_opt(o.as_mut(), &mut ob) => match r {
                        Ok(n) if n > 0 => out.push(&ob[..n]),
                        _ => o = None,
                    },
                    r = read_opt(e.as_mut(), &mut eb) => match r {
                        Ok(n) if n > 0 => err.push(&eb[..n]),
                        _ => e = None,
                    },
                    ev = events.next() => match ev {
                        Ok(Some(mut ev)) => {
                            if let crate::protocol::Event::Exit { denied: d, .. } = &mut ev {
                                denied = std::mem::take(d);
                            }
                            if let Some(st) = ExecStatus::from_event(ev) {
                                break Ok(st);
                            }
                        }
                        Ok(None) => break Err(stopped_while_running(name)),
                        Err(e) => break Err(Error::Protocol { name: name.clone(), why: e.to_string() }),
                    },
                }
            };
            // The command has ended, so what it wrote is in the pipes: take
            // that without waiting for processes it left running, which may
            // hold the pipes open for as long as they live.
            drain(o, &mut out);
            drain(e, &mut err);
            status.map(|st| (st, out, err, denied))
        };
        tokio::pin!(collect, feed);
        let (status, out, err, denied) = tokio::select! {
            r = &mut collect => r?,
            () = &mut feed => unreachable!("feeding stdin never ends by itself"),
        };
        let mut output = ExecOutput::new(status, out.finish(), err.finish(), started.elapsed());
        output.denied = denied;
        Ok(output)
    }

    /// Starts `req` with its stdin, stdout and stderr piped to the returned
    /// [`Process`] and returns once it runs (or could not start: then
    /// [`Process::wait`] tells why). The environment is exactly `req.env`.
    ///
    /// ```no_run
    /// use sifbox_engine::protocol::ExecRequest;
    /// # async fn demo(sb: sifbox_engine::aio::AsyncSandbox) -> sifbox_engine::Result<()> {
    /// let mut p = sb
    ///     .spawn(
    ///         ExecRequest::command(["/usr/local/bin/agent", "--acp"])
    ///             .base_env(sb.base_env().await?)
    ///             .cwd(Some("/workspace".into()))
    ///             .build(),
    ///     )
    ///     .await?;
    /// p.writeline(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#).await?;
    /// while let Some(line) = p.readline().await? {
    ///     println!("agent: {line}");
    /// }
    /// let status = p.wait().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn spawn(&self, req: ExecRequest) -> Result<Process> {
        self.spawn_with(req, SpawnStdio::default()).await
    }

    /// [`AsyncSandbox::spawn`] with other stdio, e.g. stderr to /dev/null
    /// for a chatty agent whose stderr nobody reads.
    pub async fn spawn_with(&self, mut req: ExecRequest, stdio: SpawnStdio) -> Result<Process> {
        if req.tty {
            return Err(no_tty());
        }
        if req.stop_after {
            return Err(AioError::StopAfter.into());
        }
        let id = match req.detach_id.take() {
            Some(id) => {
                if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric())
                {
                    return Err(AioError::ExecId(id).into());
                }
                id
            }
            None => crate::random_id(8),
        };
        // With three stdio descriptors (no status descriptor) the exec stays
        // attached to this connection, and the id registers it for Signal.
        req.detach_id = Some(id.clone());
        let (events, ends) = self.send_exec(req, stdio).await?;
        let mut p = Process {
            stdin: ends.stdin,
            stdout: ends.stdout.map(BufReader::new),
            stderr: ends.stderr.map(BufReader::new),
            id,
            pid: None,
            name: self.inner.name.clone(),
            dir: self.inner.dir.clone(),
            events,
            status: None,
            line: Vec::new(),
        };
        match p.events.next().await {
            Ok(Some(Event::Started { pid })) => p.pid = Some(pid),
            Ok(Some(ev)) => p.status = ExecStatus::from_event(ev),
            Ok(None) => return Err(stopped_while_running(&p.name)),
            Err(e) => {
                return Err(Error::Protocol {
                    name: p.name,
                    why: e.to_string(),
                })
            }
        }
        Ok(p)
    }

    /// Sends an exec request with the far ends of `stdio`; returns the
    /// connection its events come on and our ends of the pipes.
    async fn send_exec(&self, req: ExecRequest, stdio: SpawnStdio) -> Result<(Events, Ends)> {
        let (in_far, in_near) = stdio_ends(0, stdio.stdin)?;
        let (out_far, out_near) = stdio_ends(1, stdio.stdout)?;
        let (err_far, err_near) = stdio_ends(2, stdio.stderr)?;
        let ends = Ends {
            stdin: in_near
                .map(pipe::Sender::from_owned_fd)
                .transpose()
                .ctx(|| "registering a pipe with tokio".into())?,
            stdout: out_near
                .map(pipe::Receiver::from_owned_fd)
                .transpose()
                .ctx(|| "registering a pipe with tokio".into())?,
            stderr: err_near
                .map(pipe::Receiver::from_owned_fd)
                .transpose()
                .ctx(|| "registering a pipe with tokio".into())?,
        };
        let (name, dir) = (self.inner.name.clone(), self.inner.dir.clone());
        // Connecting blocks while the supervisor's backlog is full, and a
        // large request may not fit the socket buffer: off the runtime.
        let conn = blocking("sending an exec request", move || {
            let conn = connect(&name, &dir)?;
            let fds = [in_far.as_fd(), out_far.as_fd(), err_far.as_fd()];
            protocol::send(&conn, &Request::Exec(req), &fds).map_err(|e| proto(&name, e))?;
            // Our copies of the far ends close here: only the command holds
            // them now, so its output ends when its processes are gone.
            drop((in_far, out_far, err_far));
            Ok(conn)
        })
        .await?;
        conn.set_nonblocking(true)
            .ctx(|| "making the control connection non-blocking".into())?;
        let conn =
            UnixStream::from_std(conn).ctx(|| "registering a connection with tokio".into())?;
        Ok((
            Events {
                conn,
                buf: Vec::new(),
            },
            ends,
        ))
    }
}
