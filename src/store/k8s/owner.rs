//! Whose the job's objects are: in a pod that a Job, PyTorchJob, Volcano Job (or any controller) made,
//! every object the agent creates names that controller as its owner, so that the cluster's garbage
//! collector deletes them with the job, whatever killed its agents. The lemon memory is left unowned: a
//! requeued job of the same id keeps it, as on etcd. Without the pod's name or the right to read the pod,
//! the objects are unowned and the last agent deletes them (`muster status --forget` a dead job's).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::Api;

use super::client::Server;
use super::object::Owner;
use crate::store::StoreError;

/// The controller of the pod whose metadata is `pod` as its dependents name it: neither the controller
/// flag (one controller per object: the Lease has none) nor blocking the owner's deletion (that needs the
/// right to update it).
pub fn controller(pod: &ObjectMeta) -> Option<OwnerReference> {
    let reference = pod.owner_references.as_ref()?.iter().find(|r| r.controller == Some(true))?;
    Some(OwnerReference { controller: None, block_owner_deletion: None, ..reference.clone() })
}

/// The controller of pod `pod` of the handle's namespace; None (said once, at start) where the pod cannot
/// be read or has no controller: the job's objects are then deleted by its last agent only.
pub async fn find(server: &Server, pod: &str, unowned: String) -> Result<Option<Owner>, StoreError> {
    let pods: Api<Pod> = Api::namespaced(server.client.clone(), &server.namespace);
    // Its metadata only: nothing else of a pod is read (nor its spec's decoder built in).
    let why = match server.request("get", pods.get_metadata(pod)).await {
        Ok(Ok(found)) => match controller(&found.metadata) {
            Some(reference) => return Ok(Some(Owner { reference, unowned })),
            None => "it has no controller".to_string(),
        },
        Ok(Err(s)) => format!("{} ({})", s.message, s.code),
        // Reading pods is the one right the store can do without.
        Err(StoreError::KubeForbidden { message, .. }) => format!("get pods is not granted: {message}"),
        Err(e) => return Err(e),
    };
    tracing::info!(
        "the rendezvous objects are not tied to pod {pod}'s job (cannot read its owner in namespace {}: {why}): its last agent deletes them",
        server.namespace
    );
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(kind: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: "batch/v1".into(),
            kind: kind.into(),
            name: format!("{}-1", kind.to_lowercase()),
            uid: format!("uid-{kind}"),
            controller,
            block_owner_deletion: Some(true),
        }
    }

    fn pod(owners: Vec<OwnerReference>) -> ObjectMeta {
        ObjectMeta { owner_references: Some(owners), ..ObjectMeta::default() }
    }

    #[test]
    fn the_pods_controller_owns_the_objects_without_blocking_its_deletion() {
        let table = [
            (vec![reference("Job", Some(true))], Some("Job")),
            (vec![reference("Node", None), reference("PyTorchJob", Some(true))], Some("PyTorchJob")),
            (vec![reference("Job", Some(false))], None),
            (vec![], None),
        ];
        for (owners, want) in table {
            let got = controller(&pod(owners));
            assert_eq!(got.as_ref().map(|r| r.kind.as_str()), want);
            assert!(got.is_none_or(|r| r.controller.is_none() && r.block_owner_deletion.is_none()));
        }
    }
}
