//! `waymark runner install | uninstall`: the runner as a systemd user unit, so it starts with
//! the person's session and comes back after a crash or a reboot. The token goes into an
//! environment file only its owner reads, never into the unit; `KillMode=process` lets runs in
//! progress outlive a restart of the runner, which finds them again.

use std::path::PathBuf;

use serde_json::json;

use super::{RunnerOpts, allowed_dirs};
use crate::adapters::this_binary;
use crate::output::{CliResult, Exit, Failure, emit};

const UNIT: &str = "waymark-runner.service";

fn config_home() -> Result<PathBuf, Failure> {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .ok_or_else(|| {
            Failure::new(
                Exit::Usage,
                "no_home",
                "neither XDG_CONFIG_HOME nor HOME is set: cannot tell where systemd user units go",
            )
        })
}

fn unit_path() -> Result<PathBuf, Failure> {
    Ok(config_home()?.join("systemd/user").join(UNIT))
}

fn env_path() -> Result<PathBuf, Failure> {
    Ok(config_home()?.join("waymark/runner.env"))
}

/// A word of a unit's `ExecStart=`: quoted, with `\`, `"`, `%` and `$` escaped.
fn unit_word(s: &str) -> String {
    let escaped = s
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('%', "%%")
        .replace('$', "$$");
    format!("\"{escaped}\"")
}

/// The unit file and the environment file for `opts`.
pub(crate) fn files(opts: &RunnerOpts, bin: &std::path::Path) -> Result<(String, String), Failure> {
    let token = opts.token.clone().filter(|t| !t.is_empty()).ok_or_else(|| {
        Failure::new(
            Exit::Usage,
            "no_token",
            "the runner needs its machine's token: `--token` or $WAYMARK_TOKEN (`waymark admin runner-token --machine NAME` on the control plane's host)",
        )
    })?;
    let allowed = allowed_dirs(&opts.allow)?;
    let mut exec = vec![unit_word(&bin.to_string_lossy()), "runner".into()];
    for d in &allowed {
        exec.push("--allow".into());
        exec.push(unit_word(&d.to_string_lossy()));
    }
    if let Some(n) = &opts.name {
        exec.extend(["--name".into(), unit_word(n)]);
    }
    if let Some(s) = &opts.state_dir {
        exec.extend(["--state-dir".into(), unit_word(&s.to_string_lossy())]);
    }
    if let Some(c) = &opts.claude {
        exec.extend(["--claude".into(), unit_word(&c.to_string_lossy())]);
    }
    if let Some(c) = &opts.codex {
        exec.extend(["--codex".into(), unit_word(&c.to_string_lossy())]);
    }
    for (flag, bin) in [
        ("--gemini", &opts.gemini),
        ("--opencode", &opts.opencode),
        ("--copilot", &opts.copilot),
        ("--hermes", &opts.hermes),
        ("--openclaw", &opts.openclaw),
    ] {
        if let Some(b) = bin {
            exec.extend([flag.into(), unit_word(&b.to_string_lossy())]);
        }
    }
    if let Some(g) = &opts.openclaw_gateway {
        exec.extend(["--openclaw-gateway".into(), unit_word(g)]);
        exec.extend(["--openclaw-agent".into(), unit_word(&opts.openclaw_agent)]);
    }
    exec.extend([
        "--approval-timeout".into(),
        opts.approval_timeout.to_string(),
    ]);
    if opts.inhibit_sleep {
        exec.push("--inhibit-sleep".into());
    }
    let unit = format!(
        "# Written by `waymark runner install`; `waymark runner uninstall` removes it.\n\
         [Unit]\n\
         Description=Waymark runner: starts, revives and resumes agent runs on this machine\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         EnvironmentFile={}\n\
         ExecStart={}\n\
         Restart=always\n\
         RestartSec=5\n\
         # Runs in progress outlive a restart of the runner, which finds them again.\n\
         KillMode=process\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        env_path()?.display(),
        exec.join(" ")
    );
    // The runtimes run with the runner's environment: the PATH it was installed from (a user
    // unit's own PATH rarely holds `claude`), and the variables its owner adds here.
    let path = std::env::var("PATH").unwrap_or_default();
    let mut env = format!(
        "# The runner's environment; the runtimes it starts inherit it (add your runtimes' own\n\
         # variables here). Readable by its owner only: it holds the machine's token.\n\
         WAYMARK_SERVER={}\nWAYMARK_TOKEN={token}\nPATH={path}\n",
        opts.server.trim_end_matches('/')
    );
    if let Some(fp) = &opts.server_fp {
        env.push_str(&format!("{}={fp}\n", waymark_worker::SERVER_FP_ENV));
    }
    // The gateway's token, like the machine's, stays out of the unit.
    if let Some(t) = opts.openclaw_token.as_ref().filter(|t| !t.is_empty()) {
        env.push_str(&format!("OPENCLAW_GATEWAY_TOKEN={t}\n"));
    }
    Ok((unit, env))
}

fn write_private(path: &std::path::Path, text: &str, mode: u32) -> Result<(), Failure> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e: std::io::Error| {
        Failure::new(
            Exit::Refused,
            "cannot_write",
            format!("cannot write {}: {e}", path.display()),
        )
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(fail)?;
    f.write_all(text.as_bytes()).map_err(fail)?;
    f.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

fn systemctl(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("systemctl")
        .arg("--user")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run systemctl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

pub(crate) fn install(opts: &RunnerOpts, no_start: bool, json: bool) -> CliResult {
    let bin = this_binary()?;
    let (unit, env) = files(opts, &bin)?;
    let unit_file = unit_path()?;
    let env_file = env_path()?;
    write_private(&env_file, &env, 0o600)?;
    write_private(&unit_file, &unit, 0o644)?;
    let started = if no_start {
        false
    } else {
        systemctl(&["daemon-reload"])
            .and_then(|()| systemctl(&["enable", "--now", UNIT]))
            .map_err(|why| {
                Failure::new(
                    Exit::Refused,
                    "systemd",
                    format!(
                        "wrote {} but could not start it ({why}); without a user systemd, run `waymark runner --allow …` in the foreground",
                        unit_file.display()
                    ),
                )
            })?;
        true
    };
    emit(
        json,
        &json!({"unit": unit_file, "environment": env_file, "started": started}),
        || {
            format!(
                "wrote {}\n  environment (token, PATH): {} (mode 600)\n  {}",
                unit_file.display(),
                env_file.display(),
                if started {
                    "started and enabled: `systemctl --user status waymark-runner` shows it"
                } else {
                    "not started (--no-start): `systemctl --user enable --now waymark-runner`"
                }
            )
        },
    );
    Ok(())
}

pub(crate) fn uninstall(json: bool) -> CliResult {
    let unit_file = unit_path()?;
    let env_file = env_path()?;
    let existed = unit_file.exists();
    if existed {
        // Stopping fails where there is no user systemd; the files go regardless.
        let _ = systemctl(&["disable", "--now", UNIT]);
    }
    let _ = std::fs::remove_file(&unit_file);
    let _ = std::fs::remove_file(&env_file);
    if existed {
        let _ = systemctl(&["daemon-reload"]);
    }
    emit(
        json,
        &json!({"unit": unit_file, "removed": existed}),
        || {
            if existed {
                format!("removed {} and its environment file", unit_file.display())
            } else {
                format!("no runner unit at {}", unit_file.display())
            }
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_runs_this_binary_with_the_allowed_directories_and_keeps_the_token_out() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("my src");
        std::fs::create_dir_all(&src).unwrap();
        let opts = RunnerOpts {
            server: "http://127.0.0.1:7700/".into(),
            server_fp: None,
            token: Some("wmk_w_secret".into()),
            allow: vec![src.clone()],
            name: Some("laptop".into()),
            state_dir: None,
            claude: None,
            codex: Some("/opt/codex/bin/codex".into()),
            gemini: Some("/opt/gemini/bin/gemini".into()),
            opencode: None,
            copilot: None,
            hermes: Some("/opt/hermes/bin/hermes".into()),
            openclaw_gateway: Some("ws://127.0.0.1:18789".into()),
            openclaw_token: Some("oc_secret".into()),
            openclaw_agent: "main".into(),
            openclaw: None,
            approval_timeout: 600,
            inhibit_sleep: true,
        };
        let (unit, env) = files(&opts, std::path::Path::new("/opt/way mark/waymark")).unwrap();
        assert!(
            unit.contains("ExecStart=\"/opt/way mark/waymark\" runner --allow \""),
            "{unit}"
        );
        assert!(unit.contains(&format!("\"{}\"", src.canonicalize().unwrap().display())));
        assert!(unit.contains("KillMode=process") && unit.contains("Restart=always"));
        assert!(
            unit.contains(" --codex \"/opt/codex/bin/codex\" "),
            "{unit}"
        );
        assert!(
            unit.contains(" --gemini \"/opt/gemini/bin/gemini\" "),
            "{unit}"
        );
        assert!(
            unit.contains(" --hermes \"/opt/hermes/bin/hermes\" ") && !unit.contains("--opencode"),
            "{unit}"
        );
        assert!(unit.contains(" --inhibit-sleep"), "{unit}");
        assert!(
            unit.contains(" --openclaw-gateway \"ws://127.0.0.1:18789\" --openclaw-agent \"main\""),
            "{unit}"
        );
        assert!(
            !unit.contains("oc_secret") && env.contains("OPENCLAW_GATEWAY_TOKEN=oc_secret\n"),
            "the gateway's token stays out of the unit: {unit}"
        );
        assert!(
            !unit.contains("wmk_w_secret"),
            "the token stays out of the unit"
        );
        assert!(env.contains("WAYMARK_TOKEN=wmk_w_secret\n"));
        assert!(env.contains("WAYMARK_SERVER=http://127.0.0.1:7700\n"));
        assert_eq!(unit_word("50%$x\"y"), "\"50%%$$x\\\"y\"");
        let no_token = RunnerOpts {
            token: None,
            ..opts.clone()
        };
        assert_eq!(
            files(&no_token, std::path::Path::new("/w"))
                .err()
                .map(|f| f.code),
            Some("no_token")
        );
    }
}
