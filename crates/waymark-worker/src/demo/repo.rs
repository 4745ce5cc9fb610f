//! The demo's sample project: a small Python checkout service with a real bug and a pytest
//! suite, in a real git repository. Every step runs the real `git` and `python3`.

use std::path::{Path, PathBuf};
use std::process::Output;

use super::DemoError;

const CART_BUGGY: &str = r#""""Cart totals for the checkout service. Amounts are integer cents."""


def subtotal(items):
    """Sum of price * quantity over (price_cents, quantity) pairs."""
    return sum(price * quantity for price, quantity in items)


def apply_discount(amount_cents, percent):
    """The amount after a percentage discount, rounded down to the cent."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must be between 0 and 100")
    return amount_cents - amount_cents * percent // 10


def total(items, discount_percent=0):
    """What the customer pays."""
    return apply_discount(subtotal(items), discount_percent)
"#;

const TESTS: &str = r#"from checkout.cart import apply_discount, subtotal, total


def test_subtotal_sums_lines():
    assert subtotal([(1250, 2), (499, 1)]) == 2999


def test_no_discount_keeps_the_amount():
    assert total([(1000, 3)]) == 3000


def test_percentage_discount():
    assert total([(5000, 2)], discount_percent=10) == 9000


def test_discount_out_of_range_is_refused():
    try:
        apply_discount(100, 120)
    except ValueError:
        return
    raise AssertionError("a 120% discount was accepted")
"#;

/// The failing test the alert names.
pub(crate) const FAILING_TEST: &str = "tests/test_cart.py::test_percentage_discount";

/// The line that has the bug, and its fix.
const BUG: &str = "amount_cents * percent // 10\n";
const FIX: &str = "amount_cents * percent // 100\n";

/// The sample repository on disk.
#[derive(Debug, Clone)]
pub(crate) struct Repo {
    pub(crate) path: PathBuf,
}

/// A test run.
#[derive(Debug)]
pub(crate) struct TestRun {
    pub(crate) command: String,
    pub(crate) exit_code: i32,
    pub(crate) junit_xml: String,
}

async fn run_tool(dir: &Path, program: &str, args: &[&str]) -> Result<Output, DemoError> {
    let command = format!("{program} {}", args.join(" "));
    tokio::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Waymark demo agent")
        .env("GIT_AUTHOR_EMAIL", "demo@waymark.invalid")
        .env("GIT_COMMITTER_NAME", "Waymark demo agent")
        .env("GIT_COMMITTER_EMAIL", "demo@waymark.invalid")
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| DemoError::Tool {
            command,
            reason: if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "`{program}` is not installed; the demo needs `git` and `python3` with `pytest`"
                )
            } else {
                e.to_string()
            },
        })
}

async fn checked(dir: &Path, program: &str, args: &[&str]) -> Result<String, DemoError> {
    let out = run_tool(dir, program, args).await?;
    if !out.status.success() {
        return Err(DemoError::Tool {
            command: format!("{program} {}", args.join(" ")),
            reason: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> DemoError + '_ {
    move |e| DemoError::Tool {
        command: format!("write {}", path.display()),
        reason: e.to_string(),
    }
}

impl Repo {
    /// Creates the repository with its first commit, or opens it when it exists.
    pub(crate) async fn create(path: &Path) -> Result<Repo, DemoError> {
        let repo = Repo {
            path: path.to_owned(),
        };
        if path.join(".git").exists() {
            return Ok(repo);
        }
        for (rel, text) in [
            ("checkout/__init__.py", ""),
            ("checkout/cart.py", CART_BUGGY),
            ("tests/__init__.py", ""),
            ("tests/test_cart.py", TESTS),
            (".gitignore", "__pycache__/\n.pytest_cache/\n"),
            (
                "README.md",
                "# checkout-service\n\nCart totals. Run the tests with `python3 -m pytest`.\n",
            ),
        ] {
            let file = path.join(rel);
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir).map_err(io(dir))?;
            }
            std::fs::write(&file, text).map_err(io(&file))?;
        }
        checked(path, "git", &["init", "-q", "-b", "main"]).await?;
        checked(path, "git", &["add", "-A"]).await?;
        checked(
            path,
            "git",
            &[
                "-c",
                "commit.gpgsign=false",
                "commit",
                "-q",
                "-m",
                "Cart totals with percentage discounts",
            ],
        )
        .await?;
        Ok(repo)
    }

    /// The commit at HEAD.
    pub(crate) async fn head(&self) -> Result<String, DemoError> {
        Ok(checked(&self.path, "git", &["rev-parse", "HEAD"])
            .await?
            .trim()
            .to_owned())
    }

    /// Runs the suite, writing JUnit XML to `junit`.
    pub(crate) async fn test(&self, junit: &Path) -> Result<TestRun, DemoError> {
        let junit_arg = format!("--junitxml={}", junit.display());
        let args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", &junit_arg];
        let out = run_tool(&self.path, "python3", &args).await?;
        let exit_code = out.status.code().unwrap_or(-1);
        let junit_xml = std::fs::read_to_string(junit).map_err(|e| DemoError::Tool {
            command: format!("python3 {}", args.join(" ")),
            reason: format!(
                "pytest wrote no JUnit XML ({e}; exit {exit_code}): {} — install it with `python3 -m pip install pytest`",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })?;
        Ok(TestRun {
            command: "python3 -m pytest -q --junitxml=junit.xml".into(),
            exit_code,
            junit_xml,
        })
    }

    /// Applies the fix (idempotently) and returns the working tree's diff.
    pub(crate) async fn apply_fix(&self) -> Result<Vec<u8>, DemoError> {
        let file = self.path.join("checkout/cart.py");
        let text = std::fs::read_to_string(&file).map_err(io(&file))?;
        if text.contains(BUG) {
            std::fs::write(&file, text.replace(BUG, FIX)).map_err(io(&file))?;
        }
        Ok(checked(&self.path, "git", &["diff"]).await?.into_bytes())
    }

    /// Commits the working tree; when there is nothing to commit (a resumed run that already
    /// committed), HEAD stays. Returns HEAD and the diff HEAD introduced.
    pub(crate) async fn commit_fix(&self) -> Result<(String, Vec<u8>), DemoError> {
        let dirty = !checked(&self.path, "git", &["status", "--porcelain"])
            .await?
            .trim()
            .is_empty();
        if dirty {
            checked(
                &self.path,
                "git",
                &[
                    "-c",
                    "commit.gpgsign=false",
                    "commit",
                    "-q",
                    "-am",
                    "Fix percentage discount: divide by 100, not 10",
                ],
            )
            .await?;
        }
        let diff = checked(&self.path, "git", &["diff", "HEAD~1", "HEAD"]).await?;
        Ok((self.head().await?, diff.into_bytes()))
    }
}
