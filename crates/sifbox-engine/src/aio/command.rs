//! [`Command`]: an exec request built like `std::process::Command`.

use std::time::Duration;

use super::process::{Process, SpawnStdio};
use super::{AsyncSandbox, DEFAULT_MAX_OUTPUT};
use crate::error::Result;
use crate::protocol::ExecRequest;
use crate::sandbox::ExecOutput;
use crate::spec;

/// A command being built for [`AsyncSandbox::command`], as
/// `tokio::process::Command`: it starts from the sandbox's base environment
/// (later [`Command::env`] calls win), in the image's WORKDIR (else `/`),
/// as the image's USER (else root), through the image's env scripts when
/// it has them (as `sifbox exec`; see [`crate::ExecBuilder`]), with no
/// timeout; HOME becomes the user's home from the image's /etc/passwd when
/// a user is set and HOME is not.
///
/// ```no_run
/// # async fn demo(sb: sifbox_engine::aio::AsyncSandbox) -> sifbox_engine::Result<()> {
/// use std::time::Duration;
/// let out = sb
///     .command("pytest")
///     .args(["-q", "tests/"])
///     .cwd("/workspace")
///     .user("1000")
///     .env("OPENAI_API_KEY", "sk-...")
///     .timeout(Duration::from_secs(900))
///     .output()
///     .await?;
/// println!("exit {} in {} ms", out.exit_code, out.duration_ms);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Command {
    sandbox: AsyncSandbox,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<String>,
    user: Option<String>,
    timeout: Option<Duration>,
    stdin: Option<Vec<u8>>,
    max_output: usize,
    stdio: SpawnStdio,
}

impl Command {
    /// Adds an argument.
    pub fn arg(&mut self, arg: impl Into<String>) -> &mut Command {
        self.argv.push(arg.into());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(&mut self, args: I) -> &mut Command
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable (it travels inside the request only).
    pub fn env(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Command {
        let key = key.into();
        let value = value.into();
        spec::set_env(&mut self.env, &key, &value);
        self
    }

    /// Sets environment variables.
    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Command
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        for (k, v) in vars {
            self.env(k, v);
        }
        self
    }

    /// The working directory inside the sandbox (default: the image's
    /// WORKDIR, else `/`).
    pub fn cwd(&mut self, dir: impl Into<String>) -> &mut Command {
        self.cwd = Some(dir.into());
        self
    }

    /// Runs as this user of the image: `name`, `uid`, `uid:gid` or
    /// `name:group` (default: the image's USER, else root).
    pub fn user(&mut self, user: impl Into<String>) -> &mut Command {
        self.user = Some(user.into());
        self
    }

    /// Kills every process the command started after `timeout`; the exit
    /// code is then 124.
    pub fn timeout(&mut self, timeout: Duration) -> &mut Command {
        self.timeout = Some(timeout);
        self
    }

    /// The input of [`Command::output`] (default: /dev/null).
    pub fn stdin_bytes(&mut self, input: impl Into<Vec<u8>>) -> &mut Command {
        self.stdin = Some(input.into());
        self
    }

    /// How much of each stream [`Command::output`] keeps (the tail; default
    /// [`DEFAULT_MAX_OUTPUT`]).
    pub fn max_output(&mut self, bytes: usize) -> &mut Command {
        self.max_output = bytes;
        self
    }

    /// The stdio of [`Command::spawn`] (default: all piped).
    pub fn stdio(&mut self, stdio: SpawnStdio) -> &mut Command {
        self.stdio = stdio;
        self
    }

    /// The exec request this command makes.
    pub async fn request(&self) -> Result<ExecRequest> {
        let (defaults, base_env) = self.sandbox.exec_start().await?;
        Ok(ExecRequest::command(self.argv.clone())
            .defaults(&defaults)
            .base_env(base_env)
            .envs(self.env.clone())
            .cwd(self.cwd.clone())
            .user(self.user.clone())
            .timeout(self.timeout)
            .build())
    }

    /// Runs the command and captures its output ([`AsyncSandbox::exec`]).
    pub async fn output(&self) -> Result<ExecOutput> {
        let req = self.request().await?;
        self.sandbox
            .exec_capture(req, self.stdin.clone(), self.max_output)
            .await
    }

    /// Starts the command ([`AsyncSandbox::spawn`]).
    pub async fn spawn(&self) -> Result<Process> {
        let req = self.request().await?;
        self.sandbox.spawn_with(req, self.stdio).await
    }
}

impl AsyncSandbox {
    /// A command to run in the sandbox, starting from its base environment,
    /// in `/`, as root; see [`Command`].
    pub fn command(&self, program: impl Into<String>) -> Command {
        Command {
            sandbox: self.clone(),
            argv: vec![program.into()],
            env: Vec::new(),
            cwd: None,
            user: None,
            timeout: None,
            stdin: None,
            max_output: DEFAULT_MAX_OUTPUT,
            stdio: SpawnStdio::default(),
        }
    }
}
