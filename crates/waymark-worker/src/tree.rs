//! The working tree an agent works in, as git sees it — what a checkpoint records so that a
//! revive can tell a tree someone changed meanwhile from the one the run left. Read only: `git
//! status` runs with `GIT_OPTIONAL_LOCKS=0`, so looking never rewrites the person's index.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use waymark_proto::{CheckpointBody, Materials, WorkingTree};

use crate::run::Run;

/// Records a run's working tree after each call, in a checkpoint, when it changed since the
/// last one recorded here — what an adapter a runner started does, so that a revive can be
/// admitted against the tree the last call left. One at a time: calls that end together
/// write their checkpoints in turn.
#[derive(Debug)]
pub struct TreeRecorder {
    dir: PathBuf,
    last: tokio::sync::Mutex<Option<String>>,
}

impl TreeRecorder {
    pub fn new(dir: impl Into<PathBuf>) -> TreeRecorder {
        TreeRecorder {
            dir: dir.into(),
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// Reads the tree and, when it changed, writes a `working_tree` checkpoint with it. A
    /// failure is logged, never the run's: the revive then compares against an older tree,
    /// which asks a person at worst.
    pub async fn after_call(&self, run: &Run) {
        let mut last = self.last.lock().await;
        let Some(tree) = snapshot(&self.dir).await else {
            return;
        };
        if last.as_deref() == Some(tree.digest.as_str()) {
            return;
        }
        let digest = tree.digest.clone();
        let body = CheckpointBody {
            reason: "working_tree".into(),
            plan_revision: run.plan_revision(),
            materials: Some(Materials {
                tree: Some(tree),
                ..Materials::default()
            }),
            ..CheckpointBody::default()
        };
        match run.checkpoint(body).await {
            Ok(_) => *last = Some(digest),
            Err(e) => tracing::warn!(error = %e, "recording the working tree failed"),
        }
    }
}

/// The tree of the git repository holding `dir`: `None` where `dir` is in none (or git is
/// missing or fails — nothing is recorded then, and a revive checks no tree).
pub async fn snapshot(dir: &Path) -> Option<WorkingTree> {
    let root = PathBuf::from(git(dir, &["rev-parse", "--show-toplevel"]).await?.trim());
    let commit = git(&root, &["rev-parse", "--verify", "--quiet", "HEAD"])
        .await
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty());
    let status = git(
        &root,
        &[
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--no-renames",
            "--ignore-submodules=all",
        ],
    )
    .await?;
    let root2 = root.clone();
    let hashed = tokio::task::spawn_blocking(move || {
        status_paths(&status)
            .into_iter()
            .map(|p| {
                let h = content_hash(&root2.join(&p));
                (p, h)
            })
            .collect::<Vec<_>>()
    })
    .await
    .ok()?;
    Some(tree_of(commit, hashed))
}

/// The tree from its commit and every changed path with its content's hash.
fn tree_of(commit: Option<String>, mut hashed: Vec<(String, String)>) -> WorkingTree {
    hashed.sort();
    hashed.dedup_by(|a, b| a.0 == b.0);
    let mut digest = Sha256::new();
    digest.update(commit.as_deref().unwrap_or("").as_bytes());
    digest.update(b"\n");
    for (path, hash) in &hashed {
        digest.update(path.as_bytes());
        digest.update(b"\0");
        digest.update(hash.as_bytes());
        digest.update(b"\n");
    }
    let truncated = hashed.len() > WorkingTree::MAX_PATHS;
    let changed: BTreeMap<String, String> =
        hashed.into_iter().take(WorkingTree::MAX_PATHS).collect();
    WorkingTree {
        commit,
        digest: hex::encode(digest.finalize()),
        changed,
        truncated,
    }
}

/// The paths of `git status --porcelain=v1 -z --no-renames`: `XY path\0` each.
fn status_paths(status: &str) -> Vec<String> {
    status
        .split('\0')
        .filter(|e| e.len() > 3)
        .map(|e| e[3..].to_owned())
        .collect()
}

/// A short hash of what is at `path` now: its bytes, a link's target, or `deleted`.
fn content_hash(path: &Path) -> String {
    let short = |d: &[u8]| hex::encode(&d[..8]);
    match std::fs::symlink_metadata(path) {
        Err(_) => "deleted".into(),
        Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(path) {
            Ok(t) => short(&Sha256::digest(t.as_os_str().as_encoded_bytes())),
            Err(_) => "unreadable".into(),
        },
        Ok(m) if m.is_dir() => "directory".into(),
        Ok(_) => {
            let Ok(mut f) = std::fs::File::open(path) else {
                return "unreadable".into();
            };
            let mut h = Sha256::new();
            match std::io::copy(&mut f, &mut h) {
                Ok(_) => short(&h.finalize()),
                Err(_) => "unreadable".into(),
            }
        }
    }
}

async fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = tokio::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }

    #[tokio::test]
    async fn a_tree_changes_with_each_edit_and_comes_back_when_it_is_undone() {
        let repo = tempfile::tempdir().unwrap();
        let dir = repo.path();
        assert_eq!(snapshot(dir).await, None, "not a repository: no tree");
        sh(dir, &["init", "-q"]);
        std::fs::create_dir(dir.join("src")).unwrap();
        std::fs::write(dir.join("src/a.rs"), "fn a() {}\n").unwrap();
        let unborn = snapshot(&dir.join("src")).await.unwrap();
        assert_eq!(unborn.commit, None);
        assert_eq!(unborn.changed.keys().collect::<Vec<_>>(), ["src/a.rs"]);
        sh(dir, &["add", "."]);
        sh(dir, &["commit", "-qm", "one"]);
        let clean = snapshot(dir).await.unwrap();
        assert!(clean.commit.as_deref().is_some_and(|c| c.len() == 40));
        assert!(clean.changed.is_empty());

        std::fs::write(dir.join("src/a.rs"), "fn a() { b() }\n").unwrap();
        std::fs::write(dir.join("notes.md"), "todo\n").unwrap();
        let edited = snapshot(dir).await.unwrap();
        assert_ne!(edited.digest, clean.digest);
        assert_eq!(
            edited.changed.keys().collect::<Vec<_>>(),
            ["notes.md", "src/a.rs"]
        );
        std::fs::write(dir.join("src/a.rs"), "fn a() { c() }\n").unwrap();
        let again = snapshot(dir).await.unwrap();
        assert_ne!(
            again.digest, edited.digest,
            "a second edit of the same file"
        );
        assert_eq!(
            again.differences_from(&edited).unwrap(),
            "the working tree is not as the last checkpoint left it: `src/a.rs` has changed"
        );

        std::fs::remove_file(dir.join("notes.md")).unwrap();
        std::fs::write(dir.join("src/a.rs"), "fn a() {}\n").unwrap();
        assert_eq!(snapshot(dir).await.unwrap(), clean, "undone: the same tree");
        std::fs::remove_file(dir.join("src/a.rs")).unwrap();
        assert_eq!(
            snapshot(dir)
                .await
                .unwrap()
                .changed
                .get("src/a.rs")
                .map(String::as_str),
            Some("deleted")
        );
        assert!(
            !dir.join(".git/index.lock").exists(),
            "looking took no lock on the index"
        );
    }

    #[test]
    fn a_long_list_is_cut_but_the_digest_covers_every_path() {
        let many = |n: usize, last: &str| {
            let mut v: Vec<(String, String)> =
                (0..n).map(|i| (format!("f{i:04}"), "h".into())).collect();
            v.push(("zz".into(), last.into()));
            tree_of(Some("c".into()), v)
        };
        let a = many(WorkingTree::MAX_PATHS + 5, "1");
        let b = many(WorkingTree::MAX_PATHS + 5, "2");
        assert!(a.truncated);
        assert_eq!(a.changed.len(), WorkingTree::MAX_PATHS);
        assert_eq!(a.changed, b.changed, "the difference is past the list");
        assert_ne!(a.digest, b.digest);
    }
}
