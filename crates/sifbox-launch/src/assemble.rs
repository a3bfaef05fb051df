//! The one assembly of a sandbox from a resolved image and options, for
//! `run`, `start` and eval's rollouts: what each default is, and which
//! source beats which, is decided here and nowhere else.
//!
//! - the environment: sifbox's base (PATH, HOME, LANG, the host's TERM
//!   and proxy variables), then the image's, then the caller's
//!   (`--env-file`, `--env`; a task's `[environment] env`), then the host
//!   CA's variables where none of those set them;
//! - the host CA bundle: a read-only bind at
//!   [`crate::host_ca::HOST_CA_PATH`], refused when it is not a file;
//! - the logs dir: prepared (0700, or 0711 when a user of the image other
//!   than root gets its subdirs) and bound at /logs;
//! - the id map: the caller's mapping resolved from the `--userns` mode,
//!   unless the caller resolved it already (eval does, once per job);
//! - the writable layer: a tmpfs of the size asked (the default), an
//!   overlay dir on the host (never inside the image), or an ext4 disk
//!   in `$SIFBOX_SCRATCH`, else `<store>/scratch`;
//! - the limits: the flags, then `[limits]` of the config file, then
//!   sifbox's defaults (memory: 4 GiB or half the host's RAM, whichever is
//!   less; per-user processes; open files), marked as defaults in the
//!   record; or limits the caller fixed (a task's).

use std::path::{Path, PathBuf};

use sifbox_engine::evidence::ImageRef;
use sifbox_engine::idmap;
use sifbox_engine::spec::IdMapping;
use sifbox_engine::spec::{self, Bind, Confinement, NetMode, UsernsMode, Writable};
use sifbox_engine::{ExecDefaults, Sandbox, SandboxSpec, StartOptions};
use sifbox_image::store::Store;
use sifbox_registry::Resolved;

use crate::config::{LimitsConfig, UserConfig};
use crate::error::LaunchError;

/// `--memory`: a size, or no limit at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    Size(u64),
    Unlimited,
}

impl Memory {
    /// A size (`512m`, `2g`, bytes) or `unlimited`.
    pub fn parse(s: &str) -> Result<Memory, String> {
        if s.trim().eq_ignore_ascii_case("unlimited") {
            return Ok(Memory::Unlimited);
        }
        spec::parse_size(s).map(Memory::Size)
    }
}

/// Limits as the caller asked for them (`--memory`, `--pids`, ...):
/// unset ones come from the config file, else sifbox's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOptions {
    pub memory: Option<Memory>,
    pub memory_swap: Option<spec::Swap>,
    pub pids: u64,
    pub cpus_milli: Option<u32>,
    pub nofile: Option<spec::Nofile>,
}

impl Default for LimitOptions {
    fn default() -> Self {
        LimitOptions {
            memory: None,
            memory_swap: None,
            pids: spec::DEFAULT_PIDS,
            cpus_milli: None,
            nofile: None,
        }
    }
}

impl LimitOptions {
    /// The limits: these options first, then `config`, then sifbox's
    /// defaults (marked as such in the record).
    pub fn resolve(&self, config: &LimitsConfig) -> Result<spec::Limits, LaunchError> {
        let mut defaults = spec::Defaulted::default();
        let memory = match self.memory.or(config.memory) {
            Some(Memory::Size(m)) => Some(m),
            Some(Memory::Unlimited) => None,
            None => {
                defaults.memory = true;
                Some(spec::default_memory())
            }
        };
        let user_pids = config.user_pids.unwrap_or_else(|| {
            defaults.user_pids = true;
            spec::default_user_pids()
        });
        let nofile = self.nofile.or(config.nofile).unwrap_or_else(|| {
            defaults.nofile = true;
            spec::DEFAULT_NOFILE
        });
        defaults.pids = self.pids == spec::DEFAULT_PIDS;
        let l = spec::Limits {
            memory,
            memory_swap: self.memory_swap,
            pids: Some(self.pids),
            cpus_milli: self.cpus_milli,
            user_pids: Some(user_pids),
            nofile: Some(nofile),
            defaults,
        };
        l.validate()?;
        Ok(l)
    }
}

/// Where the limits come from.
#[derive(Debug, Clone)]
pub enum LimitsFrom {
    /// The caller's options, then the config file, then the defaults.
    Options(LimitOptions),
    /// Fixed by the caller (a task's resources): taken as they are.
    Exact(spec::Limits),
}

/// Where the sandbox's writes go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layer {
    /// A tmpfs of `size_mib`, gone with the sandbox.
    Tmpfs { size_mib: u64 },
    /// `dir/upper` on the host, kept for inspection.
    Overlay { dir: PathBuf },
    /// An ext4 file system of `size_mib` made for the sandbox, in
    /// `scratch` (default: `$SIFBOX_SCRATCH`, else `<store>/scratch`).
    Disk {
        size_mib: u64,
        scratch: Option<PathBuf>,
    },
}

/// The logs dir of a sandbox (`--logs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logs {
    pub dir: PathBuf,
    /// The user of the image that gets the subdirs (default: the
    /// sandbox's user).
    pub owner: Option<String>,
}

/// What a sandbox is to be, besides its image.
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// Default: `run-<random>`.
    pub name: Option<String>,
    /// Default: derived from the name.
    pub hostname: Option<String>,
    /// Commands' user (default: the image's USER, else root).
    pub user: Option<String>,
    pub net: NetMode,
    pub userns: UsernsMode,
    /// The mapping of `userns`, when the caller resolved it already.
    pub ids: Option<IdMapping>,
    pub layer: Layer,
    /// Size of /dev/shm (default: the engine's).
    pub shm_bytes: Option<u64>,
    pub confinement: Confinement,
    pub limits: LimitsFrom,
    /// The caller's variables, over the image's.
    pub env: Vec<(String, String)>,
    pub binds: Vec<Bind>,
    /// The host's CA bundle to show (see [`crate::host_ca`]).
    pub host_ca: Option<PathBuf>,
    pub logs: Option<Logs>,
}

impl SandboxOptions {
    /// A sandbox of sifbox's defaults: host network, the `auto` mapping,
    /// a tmpfs layer, the default confinement and limits.
    pub fn new() -> SandboxOptions {
        SandboxOptions {
            name: None,
            hostname: None,
            user: None,
            net: NetMode::Host,
            userns: UsernsMode::Auto,
            ids: None,
            layer: Layer::Tmpfs {
                size_mib: spec::DEFAULT_TMPFS_MIB,
            },
            shm_bytes: None,
            confinement: Confinement::default(),
            limits: LimitsFrom::Options(LimitOptions::default()),
            env: Vec::new(),
            binds: Vec::new(),
            host_ca: None,
            logs: None,
        }
    }
}

impl Default for SandboxOptions {
    fn default() -> Self {
        SandboxOptions::new()
    }
}

/// A sandbox as the options describe it, ready to launch.
#[derive(Debug)]
pub struct Planned {
    pub spec: SandboxSpec,
    /// The environment commands start with.
    pub env: Vec<(String, String)>,
    /// The logs dir (absolute), when asked for.
    pub logs: Option<PathBuf>,
    /// The user of the image to give the logs subdirs to, once the
    /// sandbox runs (None: they stay root's).
    pub logs_owner: Option<String>,
    /// The image, for the evidence.
    pub image: ImageRef,
    /// What commands default to, from the image.
    pub defaults: ExecDefaults,
    /// How ids are mapped.
    pub userns: UsernsMode,
    /// The image's pin, for the supervisor to hold for the sandbox's life.
    pub holds: Vec<PathBuf>,
}

impl Planned {
    /// How to start it: served by `exe`, its evidence in the logs dir, the
    /// image recorded and its pin held.
    pub fn start_options(&self, exe: PathBuf) -> StartOptions {
        StartOptions {
            evidence_dir: self.logs.clone(),
            image: Some(self.image.clone()),
            holds: self.holds.clone(),
            ..StartOptions::new(exe)
        }
    }
}

/// Gives the logs subdirs of the running `sandbox` to `owner` (a user of
/// the image, [`Planned::logs_owner`]; the sandbox's root chowns them,
/// which an unprivileged caller could not do on the host). Done before any
/// command runs, so that nothing inside has had a chance to replace them.
pub fn own_logs(sandbox: &Sandbox, owner: Option<&str>) -> Result<(), LaunchError> {
    let Some(owner) = owner else {
        return Ok(());
    };
    for sub in sifbox_engine::evidence::SUBDIRS {
        sandbox
            .chown(&format!("/logs/{sub}"), owner)
            .map_err(|source| LaunchError::LogsOwner {
                owner: owner.to_string(),
                sub,
                source: Box::new(source),
            })?;
    }
    Ok(())
}

/// The sifbox binary, which serves as the sandboxes' supervisor.
pub fn current_exe() -> Result<PathBuf, LaunchError> {
    std::env::current_exe().map_err(LaunchError::Exe)
}

/// Turns `image` and `opts` into a sandbox spec, its environment and its
/// record (see the module's note for each decision). Prepares the logs
/// dir, when asked for; starts nothing.
pub fn assemble(image: &Resolved, opts: &SandboxOptions) -> Result<Planned, LaunchError> {
    let limits = match &opts.limits {
        LimitsFrom::Options(o) => o.resolve(&UserConfig::load().limits()?)?,
        LimitsFrom::Exact(l) => *l,
    };
    let ids = match &opts.ids {
        Some(ids) => ids.clone(),
        None => idmap::resolve(opts.userns, &idmap::Caller::current())?,
    };
    assemble_with(image, opts, limits, ids, &Store::default_root())
}

/// [`assemble`] with its inputs from outside fixed: the limits, the id
/// map and the store's root (for the default scratch dir).
pub fn assemble_with(
    image: &Resolved,
    opts: &SandboxOptions,
    limits: spec::Limits,
    ids: IdMapping,
    store_root: &Path,
) -> Result<Planned, LaunchError> {
    let rootfs = image.rootfs.clone();
    let name = match &opts.name {
        Some(n) => n.clone(),
        None => format!("run-{}", sifbox_engine::random_id(6)),
    };
    spec::validate_name(&name)?;
    // The image's environment first, then the caller's.
    let mut extra = image.meta.env_pairs();
    extra.extend(opts.env.iter().cloned());
    let mut env = spec::clean_env(std::env::vars(), &extra);
    let mut binds = opts.binds.clone();
    if let Some(ca) = crate::host_ca::checked(opts.host_ca.clone())? {
        crate::host_ca::show(&ca, &mut binds, &mut env);
    }
    let image_user = image.meta.user.clone().filter(|u| !u.is_empty());
    let user = opts.user.clone().or(image_user);
    // The logs dir is the caller's alone (0700) unless a user of the image
    // other than root gets its subdirs: that user must pass through /logs.
    let logs_owner = opts
        .logs
        .as_ref()
        .and_then(|l| l.owner.clone().or_else(|| user.clone()));
    let passable = logs_owner
        .as_deref()
        .is_some_and(|o| !matches!(o, "root" | "0" | "0:0" | "root:root"));
    let logs = opts
        .logs
        .as_ref()
        .map(|l| sifbox_engine::evidence::prepare_logs_dir(&l.dir, passable))
        .transpose()?
        .map(|l| l.path);
    if let Some(dir) = &logs {
        binds.extend(sifbox_engine::evidence::logs_binds(dir));
    }
    let writable = writable(&opts.layer, &rootfs, store_root)?;
    let mut spec = SandboxSpec::new(name, rootfs, ids);
    if let Some(h) = &opts.hostname {
        spec.hostname.clone_from(h);
    }
    spec.net = opts.net;
    spec.writable = writable;
    spec.binds = binds;
    if let Some(shm) = opts.shm_bytes {
        spec.shm_bytes = shm;
    }
    spec.confinement = opts.confinement;
    spec.limits = limits;
    spec.validate()?;
    let defaults = ExecDefaults {
        cwd: image.meta.workdir.clone().filter(|w| !w.is_empty()),
        user,
        source_env_scripts: image.env_scripts,
    };
    Ok(Planned {
        spec,
        env,
        logs_owner: logs.as_ref().and(logs_owner),
        logs,
        image: ImageRef {
            reference: image.reference.clone(),
            digest: image.digest.as_ref().map(ToString::to_string),
            rootfs: image.rootfs.clone(),
        },
        defaults,
        userns: opts.userns,
        holds: image.pin.iter().map(|p| p.path().to_path_buf()).collect(),
    })
}

/// The writable layer of `layer`, over the image at `rootfs`.
fn writable(layer: &Layer, rootfs: &Path, store_root: &Path) -> Result<Writable, LaunchError> {
    Ok(match layer {
        Layer::Tmpfs { size_mib } => Writable::Tmpfs {
            size_mib: *size_mib,
        },
        Layer::Overlay { dir } => {
            let dir = std::path::absolute(dir)
                .map_err(|e| sifbox_engine::Error::io(format!("--overlay {}", dir.display()), e))?;
            if dir.starts_with(rootfs) {
                return Err(LaunchError::OverlayInsideImage { dir });
            }
            Writable::Overlay { dir }
        }
        Layer::Disk { size_mib, scratch } => Writable::Disk {
            size_mib: *size_mib,
            scratch: scratch
                .clone()
                .unwrap_or_else(|| sifbox_engine::disk::scratch_dir(&store_root.join("scratch"))),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sifbox_image::meta::ImageMeta;

    fn image(dir: &Path) -> Resolved {
        let mut r = Resolved::in_place(dir.to_path_buf(), "tree");
        r.meta = ImageMeta {
            env: vec![
                "A=image".into(),
                "B=image".into(),
                "SSL_CERT_FILE=/img.pem".into(),
            ],
            user: Some("app".into()),
            workdir: Some("/work".into()),
            ..ImageMeta::default()
        };
        r
    }

    fn ids() -> IdMapping {
        idmap::resolve(UsernsMode::Single, &idmap::Caller::current()).expect("single mapping")
    }

    fn plan(image: &Resolved, opts: &SandboxOptions, store: &Path) -> Result<Planned, LaunchError> {
        let limits = LimitOptions::default()
            .resolve(&LimitsConfig::default())
            .expect("limits");
        assemble_with(image, opts, limits, ids(), store)
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(e, _)| e == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_callers_variables_beat_the_images_which_beat_sifboxs() {
        let d = tempfile::tempdir().expect("tempdir");
        let img = image(d.path());
        let opts = SandboxOptions {
            name: Some("t".into()),
            env: vec![("B".into(), "caller".into()), ("PATH".into(), "/p".into())],
            ..SandboxOptions::new()
        };
        let p = plan(&img, &opts, d.path()).expect("plan");
        assert_eq!(get(&p.env, "A"), Some("image"));
        assert_eq!(get(&p.env, "B"), Some("caller"));
        assert_eq!(get(&p.env, "PATH"), Some("/p"));
        assert_eq!(get(&p.env, "HOME"), Some("/root"));
        assert_eq!(p.defaults.user.as_deref(), Some("app"));
        assert_eq!(p.defaults.cwd.as_deref(), Some("/work"));
        assert_eq!(p.image.reference, "tree");
    }

    #[test]
    fn the_host_ca_is_bound_read_only_and_sets_only_unset_variables() {
        let d = tempfile::tempdir().expect("tempdir");
        let ca = d.path().join("ca.crt");
        std::fs::write(&ca, "ca").expect("write");
        let img = image(d.path());
        let opts = SandboxOptions {
            name: Some("t".into()),
            host_ca: Some(ca.clone()),
            ..SandboxOptions::new()
        };
        let p = plan(&img, &opts, d.path()).expect("plan");
        let b = p
            .spec
            .binds
            .iter()
            .find(|b| b.dst == Path::new(crate::host_ca::HOST_CA_PATH))
            .expect("the CA's bind");
        assert!(b.readonly && b.src == ca);
        // The image set SSL_CERT_FILE: it stays.
        assert_eq!(get(&p.env, "SSL_CERT_FILE"), Some("/img.pem"));
        assert_eq!(get(&p.env, "PIP_CERT"), Some(crate::host_ca::HOST_CA_PATH));
        // A bundle that is not there is refused, naming it.
        let opts = SandboxOptions {
            host_ca: Some(d.path().join("nothing.crt")),
            ..opts
        };
        let e = plan(&img, &opts, d.path()).expect_err("no bundle");
        assert!(matches!(e, LaunchError::HostCaMissing { .. }), "{e}");
    }

    #[test]
    fn the_id_map_is_the_callers_when_given_else_resolved_from_the_mode() {
        let d = tempfile::tempdir().expect("tempdir");
        let img = image(d.path());
        let given = ids();
        let opts = SandboxOptions {
            name: Some("t".into()),
            userns: UsernsMode::Single,
            ids: Some(given.clone()),
            ..SandboxOptions::new()
        };
        let p = plan(&img, &opts, d.path()).expect("plan");
        assert_eq!(p.spec.ids, given);
        assert_eq!(p.userns, UsernsMode::Single);
        // Single: the caller's own ids alone, root inside.
        assert_eq!(p.spec.ids.uid.len(), 1);
        assert_eq!(p.spec.ids.uid[0].inside, 0);
    }

    #[test]
    fn the_writable_layer_is_the_one_asked_for() {
        let d = tempfile::tempdir().expect("tempdir");
        let img = image(d.path());
        let with = |layer: Layer| {
            let opts = SandboxOptions {
                name: Some("t".into()),
                layer,
                ..SandboxOptions::new()
            };
            plan(&img, &opts, Path::new("/store")).map(|p| p.spec.writable)
        };
        assert_eq!(
            with(Layer::Tmpfs { size_mib: 7 }).expect("tmpfs"),
            Writable::Tmpfs { size_mib: 7 }
        );
        let scratch = PathBuf::from("/scratch/here");
        assert_eq!(
            with(Layer::Disk {
                size_mib: 64,
                scratch: Some(scratch.clone())
            })
            .expect("disk"),
            Writable::Disk {
                size_mib: 64,
                scratch
            }
        );
        let outside = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            with(Layer::Overlay {
                dir: outside.path().into()
            })
            .expect("overlay"),
            Writable::Overlay {
                dir: outside.path().into()
            }
        );
        let e = with(Layer::Overlay {
            dir: d.path().join("upper"),
        })
        .expect_err("inside the image");
        assert!(matches!(e, LaunchError::OverlayInsideImage { .. }), "{e}");
    }

    #[test]
    fn the_logs_dir_is_bound_and_its_owner_defaults_to_the_user() {
        let d = tempfile::tempdir().expect("tempdir");
        let img = image(d.path());
        let logs = tempfile::tempdir().expect("tempdir");
        let opts = SandboxOptions {
            name: Some("t".into()),
            logs: Some(Logs {
                dir: logs.path().join("l"),
                owner: None,
            }),
            ..SandboxOptions::new()
        };
        let p = plan(&img, &opts, d.path()).expect("plan");
        assert_eq!(p.logs_owner.as_deref(), Some("app"));
        assert!(p.spec.binds.iter().any(|b| b.dst == Path::new("/logs")));
        assert!(p.logs.is_some());
        // No logs dir: no owner.
        let p = plan(&img, &SandboxOptions::new(), d.path()).expect("plan");
        assert_eq!(p.logs_owner, None);
    }

    #[test]
    fn flags_beat_the_config_which_beats_the_defaults() {
        let l = LimitOptions::default()
            .resolve(&LimitsConfig::default())
            .expect("ok");
        assert_eq!(l.memory, Some(spec::default_memory()));
        assert!(l.defaults.memory && l.defaults.user_pids && l.defaults.nofile);
        assert_eq!(l.nofile, Some(spec::DEFAULT_NOFILE));
        let c = LimitsConfig {
            memory: Some(Memory::Unlimited),
            user_pids: Some(50),
            nofile: Some(spec::Nofile { soft: 10, hard: 20 }),
        };
        let l = LimitOptions::default().resolve(&c).expect("ok");
        assert_eq!(l.memory, None);
        assert_eq!(l.user_pids, Some(50));
        assert!(!l.defaults.memory && !l.defaults.user_pids && !l.defaults.nofile);
        let l = LimitOptions {
            memory: Some(Memory::Size(1 << 30)),
            ..LimitOptions::default()
        }
        .resolve(&c)
        .expect("ok");
        assert_eq!(l.memory, Some(1 << 30));
    }
}
