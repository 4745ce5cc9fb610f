//! The demo's sample project: a small Python checkout service (cart, shipping, VAT) with a real
//! bug in the cart and a pytest suite of twelve tests, in a real git repository. Every step runs
//! the real `git` and `python3`; "the tests touching the change" are the test files importing a
//! module the fix changed.

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


def total_with_promo(items, code, promos):
    """What the customer pays with a promo code, as the promo service prices it."""
    return total(items, promos.percent(code))
"#;

const SHIPPING: &str = r#""""Shipping fees. Amounts are integer cents."""

FREE_OVER = 5000
RATES = {"domestic": 495, "eu": 1295}


def fee(subtotal_cents, zone, express=False):
    """The shipping fee for an order of `subtotal_cents` to `zone`."""
    if zone not in RATES:
        raise ValueError(f"no shipping to {zone!r}")
    if subtotal_cents >= FREE_OVER and not express:
        return 0
    return RATES[zone] * (2 if express else 1)
"#;

const TAX: &str = r#""""Value-added tax. Amounts are integer cents; rates in basis points."""


def vat(amount_cents, rate_bp, business=False):
    """The VAT due, rounded half up; business customers self-account (reverse charge)."""
    if business:
        return 0
    return (amount_cents * rate_bp + 5000) // 10000
"#;

const CONFTEST: &str = r#""""Fixtures shared by the suite."""

import os

import pytest


class PromoService:
    """The promo-code service the checkout asks, as a stand-in with fixed codes.

    `DEMO_PROMO_OUTAGE` names a file holding how many more calls time out, the way a flaky
    upstream does; each call that times out counts it down.
    """

    CODES = {"SPRING10": 10, "VIP25": 25}

    def percent(self, code):
        outage = os.environ.get("DEMO_PROMO_OUTAGE")
        if outage and os.path.exists(outage):
            with open(outage) as f:
                left = int(f.read().strip() or 0)
            if left > 0:
                with open(outage, "w") as f:
                    f.write(str(left - 1))
                raise TimeoutError("the promo service did not answer within 2.0 s")
        return self.CODES.get(code, 0)


@pytest.fixture
def promos():
    return PromoService()
"#;

const TESTS: &str = r#"from checkout.cart import apply_discount, subtotal, total, total_with_promo


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


def test_promo_code_from_the_promo_service(promos):
    assert total_with_promo([(2000, 1)], "VIP25", promos) == 1500
"#;

const SHIPPING_TESTS: &str = r#"import pytest

from checkout.shipping import fee


def test_free_shipping_over_the_threshold():
    assert fee(5000, "domestic") == 0


def test_flat_rate_under_the_threshold():
    assert fee(4999, "domestic") == 495


def test_express_is_never_free():
    assert fee(9000, "eu", express=True) == 2590


def test_unknown_zone_is_refused():
    with pytest.raises(ValueError):
        fee(100, "moon")
"#;

const TAX_TESTS: &str = r#"from checkout.tax import vat


def test_vat_rounds_half_up():
    assert vat(1005, 2000) == 201


def test_zero_rated_items_pay_none():
    assert vat(1000, 0) == 0


def test_business_customers_self_account():
    assert vat(1000, 2000, business=True) == 0
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
    /// Environment for test runs (e.g. the flaky upstream of `--scenario flaky-tests`).
    pub(crate) test_env: Vec<(String, String)>,
}

/// A test run.
#[derive(Debug)]
pub(crate) struct TestRun {
    /// The command as people would type it (the JUnit path shortened).
    pub(crate) command: String,
    pub(crate) exit_code: i32,
    pub(crate) junit_xml: String,
}

async fn run_tool(dir: &Path, program: &str, args: &[&str]) -> Result<Output, DemoError> {
    run_tool_env(dir, program, args, &[]).await
}

async fn run_tool_env(
    dir: &Path,
    program: &str,
    args: &[&str],
    env: &[(String, String)],
) -> Result<Output, DemoError> {
    let command = format!("{program} {}", args.join(" "));
    tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
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
            test_env: Vec::new(),
        };
        if path.join(".git").exists() {
            return Ok(repo);
        }
        for (rel, text) in [
            ("checkout/__init__.py", ""),
            ("checkout/cart.py", CART_BUGGY),
            ("checkout/shipping.py", SHIPPING),
            ("checkout/tax.py", TAX),
            ("tests/__init__.py", ""),
            ("tests/conftest.py", CONFTEST),
            ("tests/test_cart.py", TESTS),
            ("tests/test_shipping.py", SHIPPING_TESTS),
            ("tests/test_tax.py", TAX_TESTS),
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
                "Checkout: cart totals, shipping, VAT",
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

    /// Runs `selection` (pytest node ids or paths; empty: the whole suite), writing JUnit XML
    /// to `junit`.
    pub(crate) async fn test(
        &self,
        junit: &Path,
        selection: &[String],
    ) -> Result<TestRun, DemoError> {
        let junit_arg = format!("--junitxml={}", junit.display());
        let mut args = vec!["-m", "pytest", "-q", "-p", "no:cacheprovider"];
        args.extend(selection.iter().map(String::as_str));
        args.push(&junit_arg);
        // A JUnit file left by an earlier try must not pass for this one's.
        let _ = std::fs::remove_file(junit);
        let out = run_tool_env(&self.path, "python3", &args, &self.test_env).await?;
        let exit_code = out.status.code().unwrap_or(-1);
        let junit_xml = std::fs::read_to_string(junit).map_err(|e| DemoError::Tool {
            command: format!("python3 {}", args.join(" ")),
            reason: format!(
                "pytest wrote no JUnit XML ({e}; exit {exit_code}): {} — install it with `python3 -m pip install pytest`",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })?;
        let mut command = vec!["python3", "-m", "pytest", "-q"];
        command.extend(selection.iter().map(String::as_str));
        command.push("--junitxml=junit.xml");
        Ok(TestRun {
            command: command.join(" "),
            exit_code,
            junit_xml,
        })
    }

    /// The suite's test node ids, as pytest collects them.
    pub(crate) async fn collect(&self) -> Result<Vec<String>, DemoError> {
        let out = checked(
            &self.path,
            "python3",
            &[
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--collect-only",
            ],
        )
        .await?;
        Ok(out
            .lines()
            .filter(|l| l.contains("::"))
            .map(str::to_owned)
            .collect())
    }

    /// The files HEAD changed.
    pub(crate) async fn changed_files(&self) -> Result<Vec<String>, DemoError> {
        Ok(checked(
            &self.path,
            "git",
            &["diff", "--name-only", "HEAD~1", "HEAD"],
        )
        .await?
        .lines()
        .map(str::to_owned)
        .collect())
    }

    /// The test files that import one of the `changed` Python modules (sorted): the tests that
    /// touch the change.
    pub(crate) fn tests_touching(&self, changed: &[String]) -> Vec<String> {
        let modules: Vec<String> = changed
            .iter()
            .filter(|f| !f.starts_with("tests/"))
            .filter_map(|f| f.strip_suffix(".py"))
            .map(|m| m.replace('/', "."))
            .collect();
        let Ok(entries) = std::fs::read_dir(self.path.join("tests")) else {
            return Vec::new();
        };
        let mut files: Vec<String> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if !(name.starts_with("test_") && name.ends_with(".py")) {
                    return None;
                }
                let text = std::fs::read_to_string(e.path()).ok()?;
                modules
                    .iter()
                    .any(|m| {
                        text.lines().any(|l| {
                            let l = l.trim();
                            l.starts_with(&format!("from {m} import"))
                                || l == format!("import {m}")
                                || l.starts_with(&format!("import {m} "))
                        })
                    })
                    .then(|| format!("tests/{name}"))
            })
            .collect();
        files.sort();
        files
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
