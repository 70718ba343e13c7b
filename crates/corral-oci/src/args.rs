//! The command line: the subset of runc's that corral's runtime client (`task/runc.rs`) speaks,
//! so that `runtime.binary = "builtin"` changes the binary and nothing else in the client.

use std::path::PathBuf;

/// Flags before the subcommand, as runc takes them.
#[derive(Debug, PartialEq)]
pub struct Global {
    /// State root: one directory per container below it.
    pub root: PathBuf,
    /// Where JSON log lines go; stderr when absent.
    pub log: Option<PathBuf>,
    /// The container's cgroupsPath is a systemd unit (`slice:prefix:name`).
    pub systemd_cgroup: bool,
}

#[derive(Debug, PartialEq)]
pub enum Command {
    Create {
        id: String,
        bundle: PathBuf,
        pid_file: Option<PathBuf>,
        console_socket: Option<PathBuf>,
    },
    /// Always detached: the process outlives this helper, as after `runc exec --detach`.
    Exec {
        id: String,
        process: PathBuf,
        pid_file: Option<PathBuf>,
        console_socket: Option<PathBuf>,
    },
    Start {
        id: String,
    },
    Kill {
        id: String,
        signal: String,
        all: bool,
    },
    Delete {
        id: String,
        force: bool,
    },
    Pause {
        id: String,
    },
    Resume {
        id: String,
    },
    /// `--resources -`: the OCI LinuxResources document comes on stdin.
    Update {
        id: String,
        resources: PathBuf,
    },
    Ps {
        id: String,
    },
}

#[derive(Debug, PartialEq)]
pub struct Args {
    pub global: Global,
    pub command: Command,
}

/// Splits `--flag value` and `--flag=value`; `boolean` flags take no value.
struct Tokens<'a> {
    rest: std::slice::Iter<'a, String>,
}

enum Token<'a> {
    Flag(&'a str, Option<String>),
    Word(&'a str),
}

impl<'a> Tokens<'a> {
    fn next(&mut self, boolean: &[&str]) -> Result<Option<Token<'a>>, String> {
        let Some(arg) = self.rest.next() else { return Ok(None) };
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-').filter(|f| !f.is_empty()))
        else {
            return Ok(Some(Token::Word(arg)));
        };
        if let Some((name, value)) = flag.split_once('=') {
            return Ok(Some(Token::Flag(name, Some(value.to_string()))));
        }
        if boolean.contains(&flag) {
            return Ok(Some(Token::Flag(flag, None)));
        }
        let value = self.rest.next().ok_or_else(|| format!("flag --{flag} needs a value"))?;
        Ok(Some(Token::Flag(flag, Some(value.clone()))))
    }
}

impl Args {
    pub fn parse(argv: &[String]) -> Result<Args, String> {
        let mut tokens = Tokens { rest: argv.iter() };
        let mut global = Global { root: PathBuf::from("/run/corral/oci"), log: None, systemd_cgroup: false };
        let subcommand = loop {
            match tokens.next(&["systemd-cgroup", "debug"])? {
                None => return Err("no subcommand given".into()),
                Some(Token::Word(word)) => break word,
                Some(Token::Flag("root", value)) => global.root = PathBuf::from(value.unwrap_or_default()),
                Some(Token::Flag("log", value)) => global.log = value.map(PathBuf::from),
                Some(Token::Flag("log-format", value)) => {
                    if value.as_deref() != Some("json") {
                        return Err(format!(
                            "--log-format {}: only json is supported",
                            value.unwrap_or_default()
                        ));
                    }
                }
                Some(Token::Flag("systemd-cgroup", _)) => global.systemd_cgroup = true,
                Some(Token::Flag("debug", _)) => {}
                Some(Token::Flag(other, _)) => return Err(format!("unknown global flag --{other}")),
            }
        };
        if !global.root.is_absolute() {
            return Err(format!("--root {}: must be an absolute path", global.root.display()));
        }
        let command = parse_command(subcommand, &mut tokens)?;
        Ok(Args { global, command })
    }
}

fn parse_command(subcommand: &str, tokens: &mut Tokens<'_>) -> Result<Command, String> {
    let boolean: &[&str] = match subcommand {
        "exec" => &["detach", "d"],
        "kill" => &["all", "a"],
        "delete" => &["force", "f"],
        _ => &[],
    };
    let mut words = Vec::new();
    let mut flags = std::collections::HashMap::new();
    while let Some(token) = tokens.next(boolean)? {
        match token {
            Token::Word(word) => words.push(word.to_string()),
            Token::Flag(name, value) => {
                let name = match name {
                    "d" => "detach",
                    "a" => "all",
                    "f" => "force",
                    "b" => "bundle",
                    "p" => "process",
                    other => other,
                };
                flags.insert(name.to_string(), value);
            }
        }
    }
    let allowed: &[&str] = match subcommand {
        "create" => &["bundle", "pid-file", "console-socket"],
        "exec" => &["detach", "process", "pid-file", "console-socket"],
        "kill" => &["all"],
        "delete" => &["force"],
        "update" => &["resources", "r"],
        "ps" => &["format"],
        "start" | "pause" | "resume" => &[],
        other => return Err(format!("unknown subcommand {other:?}")),
    };
    if let Some(name) = flags.keys().find(|name| !allowed.contains(&name.as_str())) {
        return Err(format!("{subcommand}: unknown flag --{name}"));
    }
    let value = |name: &str| flags.get(name).cloned().flatten();
    let path = |name: &str| value(name).map(PathBuf::from);
    let (id, extra) = match words.as_slice() {
        [] => return Err(format!("{subcommand}: no container id given")),
        [id, extra @ ..] => (id.clone(), extra),
    };
    let want_extra = usize::from(subcommand == "kill");
    if extra.len() > want_extra {
        return Err(format!("{subcommand}: unexpected argument {:?}", extra[want_extra]));
    }
    Ok(match subcommand {
        "create" => Command::Create {
            bundle: path("bundle").ok_or("create: --bundle is required")?,
            pid_file: path("pid-file"),
            console_socket: path("console-socket"),
            id,
        },
        "exec" => {
            if !flags.contains_key("detach") {
                return Err("exec: only --detach is supported (the process must outlive this helper)".into());
            }
            Command::Exec {
                process: path("process").ok_or("exec: --process is required")?,
                pid_file: path("pid-file"),
                console_socket: path("console-socket"),
                id,
            }
        }
        "start" => Command::Start { id },
        "kill" => Command::Kill {
            signal: extra.first().cloned().unwrap_or_else(|| "SIGTERM".into()),
            all: flags.contains_key("all"),
            id,
        },
        "delete" => Command::Delete { force: flags.contains_key("force"), id },
        "pause" => Command::Pause { id },
        "resume" => Command::Resume { id },
        "update" => Command::Update {
            resources: path("resources").or_else(|| path("r")).ok_or("update: --resources is required")?,
            id,
        },
        "ps" => {
            if value("format").as_deref() != Some("json") {
                return Err("ps: only --format json is supported".into());
            }
            Command::Ps { id }
        }
        _ => unreachable!("checked above"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Args, String> {
        Args::parse(&line.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn corral_create_line() {
        let args = parse(
            "--root /run/r/k8s.io --log-format json --log /b/runc-log.json --systemd-cgroup create --bundle /b --console-socket /s --pid-file /b/init.pid c1",
        )
        .unwrap();
        assert_eq!(
            args.global,
            Global {
                root: "/run/r/k8s.io".into(),
                log: Some("/b/runc-log.json".into()),
                systemd_cgroup: true
            }
        );
        assert_eq!(
            args.command,
            Command::Create {
                id: "c1".into(),
                bundle: "/b".into(),
                pid_file: Some("/b/init.pid".into()),
                console_socket: Some("/s".into())
            }
        );
    }

    #[test]
    fn corral_other_lines() {
        let cmd = |l: &str| parse(&format!("--root /r --log-format json {l}")).unwrap().command;
        assert_eq!(
            cmd("exec --detach --process /b/p.json --pid-file /b/e.pid c1"),
            Command::Exec {
                id: "c1".into(),
                process: "/b/p.json".into(),
                pid_file: Some("/b/e.pid".into()),
                console_socket: None
            }
        );
        assert_eq!(cmd("kill --all c1 9"), Command::Kill { id: "c1".into(), signal: "9".into(), all: true });
        assert_eq!(cmd("kill c1"), Command::Kill { id: "c1".into(), signal: "SIGTERM".into(), all: false });
        assert_eq!(cmd("delete --force c1"), Command::Delete { id: "c1".into(), force: true });
        assert_eq!(
            cmd("update --resources - c1"),
            Command::Update { id: "c1".into(), resources: "-".into() }
        );
        assert_eq!(cmd("ps --format json c1"), Command::Ps { id: "c1".into() });
        assert_eq!(cmd("start c1"), Command::Start { id: "c1".into() });
        assert_eq!(cmd("pause c1"), Command::Pause { id: "c1".into() });
        assert_eq!(cmd("resume c1"), Command::Resume { id: "c1".into() });
    }

    #[test]
    fn bad_lines_are_named() {
        let err = |l: &str| parse(l).unwrap_err();
        assert_eq!(err("--root /r"), "no subcommand given");
        assert_eq!(err("--root r start c"), "--root r: must be an absolute path");
        assert_eq!(err("--log-format text start c"), "--log-format text: only json is supported");
        assert_eq!(err("--bogus 1 start c"), "unknown global flag --bogus");
        assert_eq!(err("frobnicate c"), "unknown subcommand \"frobnicate\"");
        assert_eq!(err("start"), "start: no container id given");
        assert_eq!(err("start a b"), "start: unexpected argument \"b\"");
        assert_eq!(err("create c"), "create: --bundle is required");
        assert_eq!(err("create --bundle /b --nope x c"), "create: unknown flag --nope");
        assert_eq!(
            err("exec --process /p c"),
            "exec: only --detach is supported (the process must outlive this helper)"
        );
        assert_eq!(err("ps c"), "ps: only --format json is supported");
        assert_eq!(err("create --bundle"), "flag --bundle needs a value");
    }
}
