//! `outbox-audit`: parse the configuration, run the audit, print the report, exit 0 when
//! clean, 1 on violations, 2 when the audit could not run.

use std::process::ExitCode;

use clap::Parser;
use outbox_audit::Config;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    match outbox_audit::audit(&config).await {
        Ok(report) => {
            if config.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("report as JSON")
                );
            } else {
                print!("{}", report.to_text());
            }
            if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("outbox-audit: could not audit: {e:#}");
            ExitCode::from(2)
        }
    }
}
