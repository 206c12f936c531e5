//! Rebuild when a migration changes: `sqlx::migrate!` embeds `migrations/order` at compile
//! time, and cargo does not watch the folder on its own (a binary built before a migration was
//! added or fixed would apply the old set).
fn main() {
    println!("cargo:rerun-if-changed=../../migrations/order");
}
