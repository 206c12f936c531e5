//! Rebuild when a migration changes: `sqlx::migrate!` embeds the outbox, inbox and ledger
//! migrations at compile time (`src/schema.rs`), and cargo does not watch the folders on its
//! own (a relay or service built before a migration was added would apply the old set).
fn main() {
    for set in ["outbox", "inbox", "ledger"] {
        println!("cargo:rerun-if-changed=../../migrations/{set}");
    }
}
