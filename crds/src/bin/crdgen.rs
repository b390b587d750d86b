//! Prints the meatspace CRDs as YAML, or writes them to the file named by
//! the only argument:
//!
//! ```text
//! cargo run -p meatspace-crds --bin crdgen > deploy/crds/meatspace.dev_meatspacetasks.yaml
//! cargo run -p meatspace-crds --bin crdgen -- deploy/crds/meatspace.dev_meatspacetasks.yaml
//! ```

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let output = args.next();
    if args.next().is_some() {
        eprintln!("usage: crdgen [OUTPUT]  (without OUTPUT the YAML goes to stdout)");
        return ExitCode::from(2);
    }
    let yaml = match meatspace_crds::crd_yaml() {
        Ok(yaml) => yaml,
        Err(e) => {
            eprintln!("crdgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let written = match &output {
        Some(path) => std::fs::write(path, &yaml),
        None => std::io::stdout().lock().write_all(yaml.as_bytes()),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crdgen: cannot write the CRD: {e}");
            ExitCode::FAILURE
        }
    }
}
