//! Rebuild when a migration changes: `sqlx::migrate!` embeds the files at compile time, and
//! cargo does not watch the folders on its own (a new migration would otherwise be missing
//! from services built before it was added).
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
