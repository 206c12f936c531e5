//! Rebuild when a migration changes: `sqlx::migrate!` embeds `migrations/stock` at compile
//! time, and cargo does not watch the folder on its own.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations/stock");
}
