//! Starting `codex app-server`: the command line is split the way a POSIX shell splits words
//! (quotes and backslashes, nothing else), so no shell sits between us and the app-server and
//! killing the child kills Codex. Pipes, variables and `&&` need an explicit `sh -c '…'`.

use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::CodexError;

/// Splits `line` into words: whitespace separates, `'…'` is literal, `"…"` keeps `\"`, `\\`,
/// `\$` and `` \` `` escapes, a backslash outside quotes escapes the next character.
pub(super) fn split(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("a single quote is not closed".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some('\n') => {}
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("a double quote is not closed".into()),
                        },
                        Some(c) => word.push(c),
                        None => return Err("a double quote is not closed".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some('\n') => {}
                    Some(c) => word.push(c),
                    None => return Err("the line ends with a lone backslash".into()),
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    if words.is_empty() {
        return Err("the command is empty".into());
    }
    Ok(words)
}

/// A started app-server with its pipes.
pub(super) struct Started {
    pub(super) child: Child,
    pub(super) stdin: ChildStdin,
    pub(super) stdout: ChildStdout,
}

/// Starts `line` in `cwd`; its stderr goes to the log, line by line.
pub(super) fn start(line: &str, cwd: Option<&Path>) -> Result<Started, CodexError> {
    let words = split(line).map_err(|reason| CodexError::Command {
        cmd: line.to_owned(),
        reason,
    })?;
    let mut cmd = Command::new(&words[0]);
    cmd.args(&words[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().map_err(|e| CodexError::Spawn {
        cmd: line.to_owned(),
        reason: e.to_string(),
    })?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(CodexError::Spawn {
            cmd: line.to_owned(),
            reason: "its standard input or output is not a pipe".into(),
        });
    };
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(target: "waymark_adapters::codex::app_server", "{line}");
            }
        });
    }
    Ok(Started {
        child,
        stdin,
        stdout,
    })
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn codex_command_lines_split_like_a_shell_without_one() {
        assert_eq!(split("codex app-server").unwrap(), ["codex", "app-server"]);
        assert_eq!(
            split("  codex   app-server\t--listen stdio://  ").unwrap(),
            ["codex", "app-server", "--listen", "stdio://"]
        );
        assert_eq!(
            split(r#"'/opt/my tools/fake' --a 'b c' "d \"e\" \$f" g\ h ''"#).unwrap(),
            ["/opt/my tools/fake", "--a", "b c", r#"d "e" $f"#, "g h", ""]
        );
        assert!(split("codex 'app-server").is_err());
        assert!(split("codex \"app-server").is_err());
        assert!(split("   ").is_err());
        assert!(split("codex\\").is_err());
    }
}
