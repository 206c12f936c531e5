//! Least-privilege roles on a test database: `deploy/postgres/roles.sql` run by `psql` exactly
//! as the book's Security page says, and the URLs of the migrator, relay and service roles on it. On the
//! shared server `trust` authentication lets each role log in without a password; what a role
//! may do is the grants, which is what the tests exercise. On a server that wants passwords
//! (the chaos run's [`crate::secured::SecuredPg`]) the admin URL carries TLS settings and the
//! admin's password, [`set_password`] gives the roles theirs, and the migrations read the
//! migrator's from a file ([`migrate_as_migrator_with`]).

use std::io::Write as _;
use std::process::{Command, Stdio};

/// The migrator role (owns the schema).
pub const MIGRATOR: &str = "outbox_migrator";
/// The relay role.
pub const RELAY: &str = "outbox_relay";

/// URLs of one database as each role.
#[derive(Debug, Clone)]
pub struct RoleUrls {
    /// As the migrator.
    pub migrator: String,
    /// As the relay.
    pub relay: String,
    /// As the service.
    pub service: String,
}

/// `url` with user `user` (and no password).
pub fn as_user(url: &str, user: &str) -> String {
    let mut u = url::Url::parse(url).expect("a PostgreSQL URL");
    u.set_username(user).unwrap();
    u.set_password(None).unwrap();
    u.to_string()
}

/// Runs `deploy/postgres/roles.sql` on the database of `admin_url` (a superuser's URL) for
/// service role `service_role`; the URLs of the three roles.
///
/// # Panics
/// When psql fails (the script stops at its first error).
pub fn apply(admin_url: &str, service_role: &str) -> RoleUrls {
    let script = crate::workspace_root().join("deploy/postgres/roles.sql");
    let out = Command::new(crate::servers::pg_bin_dir().join("psql"))
        .arg(admin_url)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-v"])
        .arg(format!("service_role={service_role}"))
        .arg("-f")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql -f deploy/postgres/roles.sql failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    RoleUrls {
        migrator: as_user(admin_url, MIGRATOR),
        relay: as_user(admin_url, RELAY),
        service: as_user(admin_url, service_role),
    }
}

/// Applies `bin`'s migrations (outbox, inbox, its own) as the migrator of `urls`, the way the
/// Kubernetes init container does (`DATABASE_MIGRATIONS=only`), then runs the roles script
/// again so the service's new tables are granted.
///
/// # Panics
/// When the migration run fails.
pub fn migrate_as_migrator(bin: &str, admin_url: &str, service_role: &str) -> RoleUrls {
    let urls = apply(admin_url, service_role);
    service_migrations(bin, &urls.migrator, &[]);
    apply(admin_url, service_role)
}

/// [`migrate_as_migrator`] with `env` for the migration runs (e.g. `DATABASE_PASSWORD_FILE`
/// holding the migrator's password, set with [`set_password`]), and the relay's own
/// migration command first: `outbox-relay migrate` (the outbox schema), then `bin` with
/// `DATABASE_MIGRATIONS=only` (outbox, inbox, its own), both as the migrator; the roles script
/// before and after.
///
/// # Panics
/// When psql or a migration run fails.
pub fn migrate_as_migrator_with(
    bin: &str,
    admin_url: &str,
    service_role: &str,
    env: &[(&str, &str)],
) -> RoleUrls {
    let urls = apply(admin_url, service_role);
    let mut migrate = Command::new(crate::proc::relay_binary());
    migrate
        .args(["migrate", "--database-url", &urls.migrator])
        .envs(env.iter().copied());
    crate::proc::run_ok(&format!("outbox-relay migrate as {MIGRATOR}"), &mut migrate);
    service_migrations(bin, &urls.migrator, env);
    apply(admin_url, service_role)
}

/// `bin` with `DATABASE_MIGRATIONS=only` on `migrator_url`, with `env`.
fn service_migrations(bin: &str, migrator_url: &str, env: &[(&str, &str)]) {
    let mut migrations = Command::new(crate::proc::workspace_binary(bin));
    migrations
        .env("DATABASE_URL", migrator_url)
        .env("DATABASE_MIGRATIONS", "only")
        .env("KAFKA_BROKERS", "127.0.0.1:1")
        .env("ALLOW_WEAK_SECRETS", "true")
        .envs(env.iter().copied());
    crate::proc::run_ok(
        &format!("{bin} DATABASE_MIGRATIONS=only as {MIGRATOR}"),
        &mut migrations,
    );
}

/// Gives `role` (made by [`apply`]) the password `password`, as the Security page's `\password` step
/// does; the server stores it as its `password_encryption` says (SCRAM on
/// [`crate::secured::SecuredPg`]). The statement goes to psql's standard input, so the
/// password is on no command line.
///
/// # Panics
/// When psql fails (e.g. the role does not exist).
pub fn set_password(admin_url: &str, role: &str, password: &str) {
    let mut child = Command::new(crate::servers::pg_bin_dir().join("psql"))
        .arg(admin_url)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run psql");
    let statement = format!(
        "ALTER ROLE \"{}\" PASSWORD '{}';\n",
        role.replace('"', "\"\""),
        password.replace('\'', "''")
    );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(statement.as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("wait for psql");
    assert!(
        out.status.success(),
        "psql: setting the password of {role} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
