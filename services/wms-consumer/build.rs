//! Rebuild when a migration changes: `sqlx::migrate!` embeds `migrations/wms` at compile
//! time, and cargo does not watch the folder on its own.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations/wms");
}
