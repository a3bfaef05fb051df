//! Finding and loading tasks: a task directory's files (task.toml or
//! task.md, instruction, solution, tests, steps, compose file), the task
//! dirs below a given dir, and `--filter`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::check::{parse_config, valid_name};
use super::model::{NetworkMode, VerifierMode};
use super::{
    bad, compose, document, is_sif_path, EnvSource, Instruction, SeparateVerifier, ServiceCommand,
    StepFiles, Task, TaskConfig, INSTRUCTION, MAX_TASK_TOML, TASK_MD, TASK_TOML,
};
use crate::error::{EvalError, Result};

/// The first of `names` that is a directory in `dir`.
fn first_dir(dir: &Path, names: &[&str]) -> Option<PathBuf> {
    names.iter().map(|n| dir.join(n)).find(|p| p.is_dir())
}

/// Reads a task's small text file (task.toml, task.md): a regular file
/// of at most 1 MiB, UTF-8.
fn read_small(path: &Path, task: &str) -> Result<String> {
    let file = path.display().to_string();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let meta = std::fs::metadata(path).map_err(|e| {
        bad(
            format!("task {task}"),
            format!("no readable {name} ({e})"),
            "pass a task directory (with task.toml and instruction.md, or task.md; environment/ and tests/), or a directory of them",
        )
    })?;
    if !meta.is_file() || meta.len() > MAX_TASK_TOML {
        return Err(bad(
            file,
            "not a regular file of at most 1 MiB",
            format!("make {name} a small text file"),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| {
        bad(
            &file,
            format!("cannot read it as UTF-8 text: {e}"),
            format!("make {name} a UTF-8 text file"),
        )
    })
}

/// Lays a compose file's values under the task file's: the task file's
/// env entries win over the service's of the same name, and its workdir
/// and limits over the service's.
fn apply_compose(config: &mut TaskConfig, c: compose::Compose) {
    let mut env = c.env;
    env.retain(|(k, _)| !config.env.iter().any(|(t, _)| t == k));
    env.append(&mut config.env);
    config.env = env;
    if config.workdir.is_none() {
        config.workdir = c.workdir;
    }
    config.default_user = c.user;
    if c.entrypoint.is_some() || c.command.is_some() {
        config.service = Some(ServiceCommand {
            entrypoint: c.entrypoint,
            command: c.command,
        });
    }
    if config.limits.cpus.is_none() {
        config.limits.cpus = c.cpus;
    }
    if config.limits.memory_mb.is_none() {
        config.limits.memory_mb = c.memory_mb;
    }
    if let Some(n) = c.network {
        // The service's network is the environment's when the task file
        // says nothing of its own (the phases' follow it).
        if config.network == NetworkMode::Public && n == NetworkMode::NoNetwork {
            config.network = n;
            if config.agent_network == NetworkMode::Public {
                config.agent_network = n;
            }
            if config.verifier_network == NetworkMode::Public {
                config.verifier_network = n;
            }
        }
    }
    config.unsupported.extend(c.unsupported);
    config.warnings.extend(c.warnings);
}

/// Loads the task in `dir` (which holds task.md, or task.toml and
/// instruction.md: task.md wins, as in BenchFlow).
pub fn load(dir: &Path) -> Result<Task> {
    let dir = std::path::absolute(dir).map_err(|e| EvalError::io(dir.display().to_string(), e))?;
    let shown = dir.display().to_string();
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .unwrap_or_default();
    if !valid_name(&name) {
        return Err(bad(
            format!("task {shown}"),
            format!("the directory name {name:?} is not a usable task name"),
            "rename the directory with letters, digits, '.', '_' and '-' only (at most 100)",
        ));
    }
    let md_path = dir.join(TASK_MD);
    let (config_file, mut config, instruction, solution, tests, file) = if md_path.exists() {
        let file = md_path.display().to_string();
        let doc = document::parse(&read_small(&md_path, &shown)?, &file)?;
        // BenchFlow's dirs: oracle/ before solution/, verifier/ before
        // tests/, or the front matter's paths.
        let solution = match &doc.oracle_dir {
            Some(p) => Some(dir.join(p)).filter(|p| p.is_dir()),
            None => first_dir(&dir, &["oracle", "solution"]),
        };
        let tests = match &doc.verifier_dir {
            Some(p) => Some(dir.join(p)),
            None => first_dir(&dir, &["verifier", "tests"]),
        };
        (
            md_path,
            doc.config,
            Instruction::Text(doc.instruction),
            solution,
            tests,
            file,
        )
    } else {
        let toml_path = dir.join(TASK_TOML);
        let file = toml_path.display().to_string();
        let config = parse_config(&read_small(&toml_path, &shown)?, &file)?;
        (
            toml_path,
            config,
            Instruction::File(dir.join(INSTRUCTION)),
            first_dir(&dir, &["solution", "oracle"]),
            first_dir(&dir, &["tests", "verifier"]),
            file,
        )
    };
    let context = dir.join("environment");
    let (compose_path, several) = compose::find(&context);
    config.warnings.extend(several);
    let mut compose_image = None;
    if let Some(p) = &compose_path {
        let c = compose::load(p, config.docker_image.as_deref())?;
        compose_image = c.image.clone().filter(|_| !c.builds);
        apply_compose(&mut config, c);
    }
    for step in &config.steps {
        if dir.join("steps").join(&step.name).join("workdir").is_dir() {
            config.unsupported.push(format!(
                "steps/{}/workdir/: sifbox does not stage a step's workdir (nor run its setup.sh)",
                step.name
            ));
        }
    }
    if !config.unsupported.is_empty() {
        // Its rollouts end `unsupported` before anything runs: what it
        // needs (a Windows Dockerfile, a rubric instead of test.sh) is not
        // looked for.
        return Ok(Task {
            name,
            environment: EnvSource::Dockerfile { context },
            tests: tests.unwrap_or_else(|| dir.join("tests")),
            solution,
            dir,
            config_file,
            config,
            instruction,
            separate_verifier: None,
            steps: Vec::new(),
        });
    }
    // A multi-step task's instructions are its steps'.
    if let Instruction::File(p) = &instruction {
        if config.steps.is_empty() && !p.is_file() {
            return Err(bad(
                format!("task {shown}"),
                format!("no {INSTRUCTION}"),
                "write the task's instruction to instruction.md (or write task.md, with the prompt)",
            ));
        }
    }
    let environment = match config.docker_image.as_ref().or(compose_image.as_ref()) {
        Some(image) if is_sif_path(image) => {
            let path = dir.join(image);
            if !path.is_file() {
                return Err(bad(
                    format!("{file}: [environment] docker_image = {image:?}"),
                    format!("no such SIF file: {}", path.display()),
                    "name a .sif file relative to the task's directory (or absolute), or an image of the store",
                ));
            }
            EnvSource::Sif(path)
        }
        Some(image) => EnvSource::Image(image.clone()),
        None => {
            if !context.join("Dockerfile").is_file() {
                let why = match &compose_path {
                    Some(p) => format!(
                        "{} neither builds environment/Dockerfile (there is none) nor names an image",
                        p.display()
                    ),
                    None => "no environment/Dockerfile and no [environment] docker_image".to_string(),
                };
                return Err(bad(
                    format!("task {shown}"),
                    why,
                    "add environment/Dockerfile, or set docker_image in the task's file",
                ));
            }
            EnvSource::Dockerfile { context }
        }
    };
    let steps = step_files(&dir, &config, solution.as_ref())?;
    let tests = match tests {
        Some(t) => t,
        // Every step has its own tests.
        None if !steps.is_empty() => dir.join("tests"),
        None => {
            return Err(bad(
                format!("task {shown}"),
                "no tests/ (or verifier/) directory",
                "add tests/test.sh, which writes the reward to /logs/verifier/reward.txt",
            ))
        }
    };
    let separate_verifier = match config.verifier_mode {
        VerifierMode::Shared => None,
        VerifierMode::Separate => Some(match &config.verifier_image {
            Some(image) if is_sif_path(image) => {
                let path = dir.join(image);
                if !path.is_file() {
                    return Err(bad(
                        format!("{file}: [verifier.environment] docker_image = {image:?}"),
                        format!("no such SIF file: {}", path.display()),
                        "name a .sif file relative to the task's directory (or absolute), or an image of the store",
                    ));
                }
                SeparateVerifier {
                    environment: EnvSource::Sif(path),
                    bundled_tests: true,
                }
            }
            Some(image) => SeparateVerifier {
                environment: EnvSource::Image(image.clone()),
                bundled_tests: true,
            },
            None if tests.join("Dockerfile").is_file() => SeparateVerifier {
                environment: EnvSource::Dockerfile {
                    context: tests.clone(),
                },
                bundled_tests: true,
            },
            None => SeparateVerifier {
                environment: environment.clone(),
                bundled_tests: false,
            },
        }),
    };
    // A verifier image that holds its tests needs no test.sh here.
    let bundled = separate_verifier.as_ref().is_some_and(|v| v.bundled_tests);
    if !bundled && steps.is_empty() && !tests.join("test.sh").is_file() {
        return Err(bad(
            format!("task {shown}"),
            format!("no test.sh in {}", tests.display()),
            "add test.sh, which writes the reward to /logs/verifier/reward.txt",
        ));
    }
    if tests.join("verifier.md").is_file() {
        config.warnings.push(format!(
            "{}: sifbox reads no verifier strategy documents; it runs test.sh",
            tests.join("verifier.md").display()
        ));
    }
    Ok(Task {
        name,
        solution,
        dir,
        config_file,
        config,
        instruction,
        environment,
        tests,
        separate_verifier,
        steps,
    })
}

/// The files of `config`'s steps in the task `dir` (Harbor's
/// `TaskPaths.step_*`): each step's instruction.md, its tests (merged over
/// the task's) and its solution (else the task's). A step's dir must stay
/// in the task (no symlink out of it).
fn step_files(
    dir: &Path,
    config: &TaskConfig,
    solution: Option<&PathBuf>,
) -> Result<Vec<StepFiles>> {
    let shown = dir.display();
    let task_real = std::fs::canonicalize(dir).map_err(|e| EvalError::io(shown.to_string(), e))?;
    let shared_tests = first_dir(dir, &["tests", "verifier"]);
    let mut out = Vec::new();
    for step in &config.steps {
        let step_dir = dir.join("steps").join(&step.name);
        let within = std::fs::canonicalize(&step_dir)
            .map(|p| p.starts_with(&task_real))
            .unwrap_or(false);
        if !within {
            return Err(bad(
                format!("task {shown}: step {:?}", step.name),
                format!("no directory steps/{} in the task", step.name),
                "make steps/NAME/ (with instruction.md, and tests/test.sh unless tests/test.sh serves every step) for each [[steps]] name",
            ));
        }
        let instruction = step_dir.join(INSTRUCTION);
        if !instruction.is_file() {
            return Err(bad(
                format!("task {shown}: step {:?}", step.name),
                format!("no steps/{}/{INSTRUCTION}", step.name),
                "write the step's instruction to steps/NAME/instruction.md",
            ));
        }
        let own_tests = Some(step_dir.join("tests")).filter(|t| t.is_dir());
        let test_script = [own_tests.as_ref(), shared_tests.as_ref()]
            .into_iter()
            .flatten()
            .map(|t| t.join("test.sh"))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                bad(
                    format!("task {shown}: step {:?}", step.name),
                    format!("no steps/{}/tests/test.sh and no tests/test.sh", step.name),
                    "add the step's test.sh (or one in tests/ for every step), which writes the reward to /logs/verifier/reward.txt",
                )
            })?;
        out.push(StepFiles {
            instruction: Instruction::File(instruction),
            tests: [shared_tests.clone(), own_tests]
                .into_iter()
                .flatten()
                .collect(),
            test_script,
            solution: Some(step_dir.join("solution"))
                .filter(|s| s.is_dir())
                .or_else(|| solution.cloned()),
        });
    }
    Ok(out)
}

/// Checks `--filter` patterns (shell globs: `*`, `?`, `[...]`) before
/// anything runs.
pub fn check_filters(patterns: &[String]) -> Result<()> {
    for f in patterns {
        sifbox_build::glob::check(f)
            .map_err(|why| bad(format!("--filter {f}"), why, "fix the pattern"))?;
    }
    Ok(())
}

/// The tasks whose names match one of `patterns` (every task when there is
/// none); that none matches is bad input.
pub fn select(mut tasks: Vec<Task>, patterns: &[String]) -> Result<Vec<Task>> {
    check_filters(patterns)?;
    if patterns.is_empty() {
        return Ok(tasks);
    }
    tasks.retain(|t| {
        patterns
            .iter()
            .any(|f| sifbox_build::glob::matches(f, &t.name))
    });
    if tasks.is_empty() {
        return Err(bad(
            format!("--filter {}", patterns.join(" --filter ")),
            "no task matches",
            "check the pattern against the task directory names",
        ));
    }
    Ok(tasks)
}

/// How deep below a given dir tasks are looked for.
const MAX_DEPTH: usize = 32;

/// The task dirs at or below `dir`: `dir` itself when it holds task.toml
/// (nothing below a task is looked at), else the task dirs at any depth
/// below it (hidden dirs skipped), sorted by path, into `out`. `seen`
/// holds the canonical dirs walked so far, and whether tasks are at or
/// below them (a symlink loop, a dir given twice, nested dirs given both:
/// each is walked once). Returns whether tasks are at or below `dir`,
/// found now or before.
fn task_dirs(
    dir: &Path,
    depth: usize,
    seen: &mut HashMap<PathBuf, bool>,
    out: &mut Vec<PathBuf>,
) -> Result<bool> {
    let canon = std::fs::canonicalize(dir)
        .map_err(|e| EvalError::io(format!("reading {}", dir.display()), e))?;
    if let Some(had) = seen.get(&canon) {
        return Ok(*had);
    }
    seen.insert(canon.clone(), false);
    if dir.join(TASK_TOML).is_file() || dir.join(TASK_MD).is_file() {
        out.push(dir.to_path_buf());
        seen.insert(canon, true);
        return Ok(true);
    }
    if depth >= MAX_DEPTH {
        return Ok(false);
    }
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| EvalError::io(format!("listing {}", dir.display()), e))?
        .filter_map(std::result::Result::ok)
        .filter(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    subdirs.sort();
    let mut any = false;
    for d in subdirs {
        any |= task_dirs(&d, depth + 1, seen, out)?;
    }
    seen.insert(canon, any);
    Ok(any)
}

/// The tasks that `paths` name: a task dir (with task.toml) is one task; a
/// dir without task.toml stands for the task dirs at any depth in it (a
/// task's own subdirs are not looked in). Each dir counts once, however
/// often it is named; task names (the dirs' names) must be unique.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<Task>> {
    let mut tasks: Vec<Task> = Vec::new();
    if paths.is_empty() {
        return Err(bad(
            "sifbox eval",
            "no task given",
            "pass task directories, or a directory of them (e.g. examples/tasks)",
        ));
    }
    // Task dirs first: a dir named inside another that was named is
    // walked once, and its tasks are the first dir's.
    let mut seen = HashMap::new();
    for p in paths {
        let shown = p.display().to_string();
        if !p.is_dir() {
            return Err(bad(
                format!("task {shown}"),
                "no such directory",
                "pass a task directory, or a directory of them",
            ));
        }
        let mut found = Vec::new();
        if !task_dirs(p, 0, &mut seen, &mut found)? {
            return Err(bad(
                format!("task {shown}"),
                format!("no {TASK_TOML} or {TASK_MD} in it or below it"),
                "pass a task directory (with task.toml or task.md), or a directory of them",
            ));
        }
        for d in found {
            tasks.push(load(&d)?);
        }
    }
    let mut seen = std::collections::BTreeMap::new();
    for t in &tasks {
        if let Some(other) = seen.insert(t.name.clone(), t.dir.clone()) {
            return Err(bad(
                format!("task {}", t.name),
                format!(
                    "two tasks have this name: {} and {}",
                    other.display(),
                    t.dir.display()
                ),
                "pass each task once; results are kept by task name",
            ));
        }
    }
    Ok(tasks)
}
#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    fn make_task(root: &Path, name: &str, solution: &str, tests: &str) -> PathBuf {
        let d = root.join(name);
        write(&d, "task.toml", "[agent]\ntimeout_sec = 5\n");
        write(&d, "instruction.md", "do it");
        write(&d, "environment/Dockerfile", "FROM base\n");
        write(&d, &format!("{solution}/solve.sh"), "true");
        write(
            &d,
            &format!("{tests}/test.sh"),
            "echo 1 > /logs/verifier/reward.txt",
        );
        d
    }

    #[test]
    fn a_steps_files_are_its_own_else_the_tasks() {
        let root = tempfile::tempdir().expect("tempdir");
        let d = make_task(root.path(), "m", "solution", "tests");
        write(
            &d,
            "task.toml",
            "[[steps]]\nname = \"a\"\n[[steps]]\nname = \"b\"\n",
        );
        std::fs::remove_file(d.join("instruction.md")).expect("rm");
        // No steps/a/instruction.md: refused, naming the step.
        let e = load(&d).expect_err("no step dir");
        assert!(e.to_string().contains("step \"a\""), "{e}");
        write(&d, "steps/a/instruction.md", "do a");
        write(
            &d,
            "steps/a/tests/test.sh",
            "echo 1 > /logs/verifier/reward.txt",
        );
        write(&d, "steps/a/solution/solve.sh", "true");
        write(&d, "steps/b/instruction.md", "do b");
        let t = load(&d).expect("load");
        let (a, b) = (&t.steps[0], &t.steps[1]);
        assert_eq!(a.tests, [d.join("tests"), d.join("steps/a/tests")]);
        assert_eq!(a.test_script, d.join("steps/a/tests/test.sh"));
        assert_eq!(a.solution, Some(d.join("steps/a/solution")));
        assert_eq!(b.tests, [d.join("tests")]);
        assert_eq!(b.test_script, d.join("tests/test.sh"));
        assert_eq!(b.solution, Some(d.join("solution")));
        // No test.sh for b at all: refused.
        std::fs::remove_file(d.join("tests/test.sh")).expect("rm");
        let e = load(&d).expect_err("no test for b");
        assert!(e.to_string().contains("step \"b\""), "{e}");
        // A step's workdir/ is not staged: the task is unsupported.
        write(&d, "tests/test.sh", "true");
        write(&d, "steps/b/workdir/setup.sh", "true");
        let t = load(&d).expect("load");
        assert!(
            t.config.unsupported[0].contains("steps/b/workdir/"),
            "{:?}",
            t.config
        );
    }

    #[test]
    fn a_separate_verifiers_image_by_harbors_precedence() {
        let root = tempfile::tempdir().expect("tempdir");
        // The task's environment, tests uploaded.
        let d = make_task(root.path(), "a", "solution", "tests");
        write(
            &d,
            "task.toml",
            "[verifier]\nenvironment_mode = \"separate\"\n",
        );
        let t = load(&d).expect("load");
        let v = t.separate_verifier.expect("separate");
        assert_eq!(v.environment, t.environment);
        assert!(!v.bundled_tests);
        // tests/Dockerfile: built from tests/, which holds the tests.
        write(&d, "tests/Dockerfile", "FROM base\nCOPY . /tests\n");
        let t = load(&d).expect("load");
        let v = t.separate_verifier.expect("separate");
        assert_eq!(
            v.environment,
            EnvSource::Dockerfile {
                context: d.join("tests")
            }
        );
        assert!(v.bundled_tests);
        // [verifier.environment] docker_image comes first; no test.sh
        // is needed on the host then.
        write(
            &d,
            "task.toml",
            "[verifier.environment]\ndocker_image = \"grader\"\n",
        );
        std::fs::remove_file(d.join("tests/test.sh")).expect("rm");
        let t = load(&d).expect("load");
        let v = t.separate_verifier.expect("separate");
        assert_eq!(v.environment, EnvSource::Image("grader".into()));
        assert!(v.bundled_tests);
        // A shared verifier still needs test.sh.
        write(&d, "task.toml", "");
        load(&d).expect_err("no test.sh");
    }

    #[test]
    fn layouts_and_discovery() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = make_task(root.path(), "b-task", "solution", "tests");
        let b = make_task(root.path(), "a-task", "oracle", "verifier");
        std::fs::create_dir(root.path().join("not-a-task")).expect("mkdir");
        let tasks = discover(&[root.path().to_path_buf()]).expect("discover");
        let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a-task", "b-task"]);
        assert_eq!(
            tasks[0].solution.as_deref(),
            Some(b.join("oracle").as_path())
        );
        assert_eq!(tasks[0].tests, b.join("verifier"));
        assert_eq!(tasks[1].tests, a.join("tests"));
        assert_eq!(
            tasks[1].environment,
            EnvSource::Dockerfile {
                context: a.join("environment")
            }
        );
        // One task by its own dir; the same dir twice, or a task and the
        // dir above it, count once.
        assert_eq!(discover(std::slice::from_ref(&a)).expect("one").len(), 1);
        assert_eq!(discover(&[a.clone(), a.clone()]).expect("twice").len(), 1);
        let both = discover(&[a.clone(), root.path().to_path_buf(), a.join(".")]).expect("nested");
        let names: Vec<&str> = both.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["b-task", "a-task"]);
        // Any depth, not inside a task, hidden dirs skipped; two dirs of
        // one name are refused.
        let deep = root.path().join("suite/x/y");
        make_task(&deep, "deep-task", "solution", "tests");
        make_task(&a.join("tests"), "inside-a-task", "solution", "tests");
        make_task(
            &root.path().join(".hidden"),
            "hidden-task",
            "solution",
            "tests",
        );
        let all = discover(&[root.path().to_path_buf()]).expect("deep");
        let names: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a-task", "b-task", "deep-task"]);
        make_task(&root.path().join("suite"), "a-task", "solution", "tests");
        let e = discover(&[root.path().to_path_buf()]).expect_err("same name");
        assert!(e.to_string().contains("two tasks"), "{e}");
        // A dir with no task at all.
        let e = discover(&[root.path().join("not-a-task")]).expect_err("none");
        assert!(
            e.is_bad_input() && e.to_string().contains("task.toml"),
            "{e}"
        );
        // A task without tests, without a Dockerfile.
        std::fs::remove_file(a.join("tests/test.sh")).expect("rm");
        assert!(load(&a)
            .expect_err("no test.sh")
            .to_string()
            .contains("test.sh"));
        std::fs::remove_file(b.join("environment/Dockerfile")).expect("rm");
        assert!(load(&b)
            .expect_err("no env")
            .to_string()
            .contains("Dockerfile"));
        write(
            &b,
            "task.toml",
            "[environment]\ndocker_image = \"debian:bookworm\"\n",
        );
        assert_eq!(
            load(&b).expect("image").environment,
            EnvSource::Image("debian:bookworm".into())
        );
        // A .sif file: relative to the task's dir, or absolute; it must exist.
        write(
            &b,
            "task.toml",
            "[environment]\ndocker_image = \"img/base.sif\"\n",
        );
        let e = load(&b).expect_err("no sif").to_string();
        assert!(
            e.contains("no such SIF file") && e.contains("base.sif"),
            "{e}"
        );
        write(&b, "img/base.sif", "not really");
        assert_eq!(
            load(&b).expect("sif").environment,
            EnvSource::Sif(b.join("img/base.sif"))
        );
        let abs = b.join("img/base.sif").display().to_string();
        write(
            &b,
            "task.toml",
            &format!("[environment]\ndocker_image = {abs:?}\n"),
        );
        assert_eq!(
            load(&b).expect("abs").environment,
            EnvSource::Sif(b.join("img/base.sif"))
        );
        // An unsupported task loads without what it cannot use (here no
        // tests/test.sh: an LLM judge's task has a rubric instead).
        write(&a, "task.toml", "[verifier]\ntype = \"llm-judge\"\n");
        let t = load(&a).expect("unsupported loads");
        assert_eq!(t.config.unsupported.len(), 1);
        // The oracle's script.
        assert!(t.solve_script().is_some());
        std::fs::remove_file(a.join("solution/solve.sh")).expect("rm");
        assert!(t.solve_script().is_none());
    }

    #[test]
    fn task_md_and_compose_files() {
        let root = tempfile::tempdir().expect("tempdir");
        // task.md alone is a task, found by discovery; it wins over a
        // task.toml beside it, and its dirs are BenchFlow's (oracle/ and
        // verifier/ before solution/ and tests/).
        let d = root.path().join("md");
        write(
            &d,
            "task.md",
            "---\nimage: busybox\nagent: {timeout_sec: 5}\n---\n## prompt\nDo it.\n",
        );
        write(&d, "task.toml", "[environment]\ndocker_image = \"other\"\n");
        write(&d, "verifier/test.sh", "true");
        write(&d, "tests/test.sh", "true");
        write(&d, "oracle/solve.sh", "true");
        write(&d, "solution/solve.sh", "true");
        let tasks = discover(&[root.path().to_path_buf()]).expect("discover");
        assert_eq!(tasks.len(), 1);
        let t = &tasks[0];
        assert_eq!(t.environment, EnvSource::Image("busybox".into()));
        assert_eq!(t.instruction, Instruction::Text("Do it.".into()));
        assert_eq!(t.config_file, d.join("task.md"));
        assert_eq!(t.tests, d.join("verifier"));
        assert_eq!(t.solution.as_deref(), Some(d.join("oracle").as_path()));
        // A compose file of one service: under task.toml's values.
        let c = make_task(root.path(), "composed", "solution", "tests");
        write(
            &c,
            "task.toml",
            "[environment]\nenv = { A = \"toml\" }\nmemory_mb = 100\n",
        );
        write(
            &c,
            "environment/docker-compose.yaml",
            "services:\n  main:\n    build: .\n    environment: {A: compose, B: b}\n    working_dir: /w\n    user: agent\n    mem_limit: 1g\n    cpus: 2\n",
        );
        let t = load(&c).expect("compose");
        assert_eq!(
            t.config.env,
            [
                ("B".to_string(), "b".to_string()),
                ("A".into(), "toml".into())
            ]
        );
        assert_eq!(t.config.workdir.as_deref(), Some("/w"));
        assert_eq!(t.config.default_user.as_deref(), Some("agent"));
        assert_eq!(
            (t.config.limits.memory_mb, t.config.limits.cpus),
            (Some(100), Some(2.0))
        );
        assert!(
            t.config.unsupported.is_empty(),
            "{:?}",
            t.config.unsupported
        );
        // Two services: unsupported, not bad input, also without a
        // Dockerfile; a malformed compose file is bad input.
        std::fs::remove_file(c.join("environment/Dockerfile")).expect("rm");
        write(
            &c,
            "environment/compose.yaml",
            "services:\n  main: {build: .}\n  db: {image: pg}\n",
        );
        std::fs::remove_file(c.join("environment/docker-compose.yaml")).expect("rm");
        let t = load(&c).expect("unsupported loads");
        assert!(
            t.config.unsupported[0].contains("multi-service compose"),
            "{:?}",
            t.config.unsupported
        );
        write(&c, "environment/compose.yaml", "services: [\n");
        let e = load(&c).expect_err("malformed");
        assert!(
            e.is_bad_input() && e.to_string().contains("compose.yaml:"),
            "{e}"
        );
        // A service naming an image and no build, without a Dockerfile or
        // docker_image: the task's image.
        write(
            &c,
            "environment/compose.yaml",
            "services:\n  main: {image: busybox}\n",
        );
        assert_eq!(
            load(&c).expect("image").environment,
            EnvSource::Image("busybox".into())
        );
    }
}
