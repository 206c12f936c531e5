//! `relay-bench`: parse the flags, run the benchmark, print the table, write the JSON.

use anyhow::Context;
use clap::Parser;
use relay_bench::cli::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let report = relay_bench::run(&args).await?;
    let out = args.out_path();
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", out.display()))?;
    print!("{}", report.table());
    println!("JSON: {}", out.display());
    if !report.errors.is_empty() {
        anyhow::bail!("{} phase(s) failed", report.errors.len());
    }
    Ok(())
}
