//! meatspace's Kubernetes custom resources and the CRD YAML generated from
//! them.
//!
//! The types are the single source of the CRD: `crdgen` prints
//! [`crd_yaml`], which is checked in at [`CRD_PATH`], and a unit test fails
//! when the checked-in file no longer matches the types. Only kube's derive
//! is used here (no client), so the controller and the tests can depend on
//! these types cheaply.

mod task;

pub use task::{
    CONDITION_ACTIVE, CONDITION_CREATED, CONDITION_PUBLISHED, CONDITION_SPEC_APPLIED,
    CONDITION_TERMINAL, FIELD_MANAGER, IssueResponse, MANAGED_BY, MANAGED_BY_LABEL, MeatspaceTask,
    MeatspaceTaskSpec, MeatspaceTaskStatus, OpenIssue, Origin, PresenceRule, ResponseAction,
    ResponseResult, ResponseStatus, ReviewStatus, ReviewTerms, ReviewVerdict, TaskLocation,
    TaskRequirement, VerdictAction, condition, desired, resource_name, status,
};

use kube::CustomResourceExt;

/// Where the generated CRD lives, relative to the repository root.
pub const CRD_PATH: &str = "deploy/crds/meatspace.dev_meatspacetasks.yaml";

/// The command that regenerates [`CRD_PATH`], run from the repository root.
pub const REGENERATE: &str =
    "cargo run -p meatspace-crds --bin crdgen > deploy/crds/meatspace.dev_meatspacetasks.yaml";

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot serialize the CRD as YAML: {0}")]
    Yaml(#[from] serde_saphyr::SerializeError),
}

/// The `MeatspaceTask` CustomResourceDefinition as a YAML document, with a
/// header saying how it was made.
pub fn crd_yaml() -> Result<String, Error> {
    let body = serde_saphyr::to_string(&MeatspaceTask::crd())?;
    Ok(format!(
        "# Generated from the meatspace-crds crate; do not edit.\n# Regenerate with: {REGENERATE}\n{body}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_names_columns_and_subresources() {
        let crd = MeatspaceTask::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("meatspacetasks.meatspace.dev")
        );
        assert_eq!(crd.spec.group, "meatspace.dev");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.short_names, Some(vec!["mst".to_owned()]));
        assert_eq!(
            crd.spec.names.categories,
            Some(vec!["meatspace".to_owned()])
        );
        let [version] = crd.spec.versions.as_slice() else {
            panic!("one version expected");
        };
        assert_eq!(version.name, "v1alpha1");
        assert!(version.served && version.storage);
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let columns: Vec<_> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .filter(|c| c.priority.unwrap_or(0) == 0)
            .map(|c| (c.name.as_str(), c.type_.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            columns,
            [
                ("State", "string", ".status.state"),
                ("Open Issues", "integer", ".status.openIssues"),
                ("Expires", "string", ".status.expiresAt"),
                ("Age", "date", ".metadata.creationTimestamp"),
            ]
        );
    }

    #[test]
    fn checked_in_crd_is_up_to_date() {
        let path = format!("{}/../{CRD_PATH}", env!("CARGO_MANIFEST_DIR"));
        let generated = crd_yaml().expect("the CRD serializes");
        let checked_in = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("cannot read {CRD_PATH} ({e}); generate it from the repository root with:\n    {REGENERATE}")
        });
        assert!(
            checked_in == generated,
            "{CRD_PATH} is stale: it differs from what the MeatspaceTask types generate.\n\
             Regenerate it from the repository root with:\n    {REGENERATE}\nand commit the result."
        );
    }
}
