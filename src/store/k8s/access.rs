//! Whether this agent may do what the rendezvous does, asked once at start: a pod whose service account
//! lacks a verb fails there with one line naming it (exit 2), not at the first eviction or clean-up hours
//! into the job. One SelfSubjectRulesReview (every authenticated user may make one) lists what the
//! namespace allows; the check of its rules is pure.

use k8s_openapi::api::authorization::v1::{ResourceRule, SelfSubjectRulesReview, SelfSubjectRulesReviewSpec};
use kube::api::{Api, PostParams};

use super::client::Server;
use crate::store::StoreError;

/// Every verb the store uses on `leases.coordination.k8s.io` (packaging/k8s's Role grants these, no more).
pub const VERBS: [&str; 8] = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];
const GROUP: &str = "coordination.k8s.io";
const RESOURCE: &str = "leases";

/// The verbs of [`VERBS`] that `rules` do not grant on every Lease of the namespace.
pub fn missing(rules: &[ResourceRule]) -> Vec<&'static str> {
    let any = |list: &Option<Vec<String>>, want: &str| list.as_ref().is_some_and(|l| l.iter().any(|v| v == want || v == "*"));
    VERBS
        .into_iter()
        .filter(|verb| {
            !rules.iter().any(|r| {
                r.verbs.iter().any(|v| v == verb || v == "*")
                    && any(&r.api_groups, GROUP)
                    && any(&r.resources, RESOURCE)
                    && r.resource_names.as_ref().is_none_or(Vec::is_empty)
            })
        })
        .collect()
}

/// Asks the server what this agent may do in its namespace; an incomplete answer (an authorizer that
/// cannot list rules, e.g. a webhook) is not a refusal: the requests themselves will say.
pub async fn check(server: &Server) -> Result<(), StoreError> {
    let reviews: Api<SelfSubjectRulesReview> = Api::all(server.client.clone());
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec { namespace: Some(server.namespace.clone()) },
        ..SelfSubjectRulesReview::default()
    };
    let answer = server.call("review", reviews.create(&PostParams::default(), &review)).await?;
    let Some(status) = answer.status else { return Ok(()) };
    if status.incomplete {
        tracing::debug!("the API server's rules review is incomplete: {:?}", status.evaluation_error);
        return Ok(());
    }
    match missing(&status.resource_rules).first() {
        None => Ok(()),
        Some(verb) => Err(StoreError::KubeForbidden {
            verb: verb.to_string(),
            namespace: server.namespace.clone(),
            message: "not granted by the rules the API server lists for this agent".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> ResourceRule {
        let strings = |l: &[&str]| Some(l.iter().map(|s| s.to_string()).collect());
        ResourceRule {
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            api_groups: strings(groups),
            resources: strings(resources),
            resource_names: if names.is_empty() { None } else { strings(names) },
        }
    }

    #[test]
    fn the_verbs_not_granted_on_every_lease_are_missing() {
        let all: Vec<&str> = VERBS.to_vec();
        let table: Vec<(Vec<ResourceRule>, Vec<&str>)> = vec![
            (vec![], all.clone()),
            (vec![rule(&VERBS, &[GROUP], &[RESOURCE], &[])], vec![]),
            (vec![rule(&["*"], &["*"], &["*"], &[])], vec![]),
            // Granted on one named Lease only: not every Lease of the job.
            (vec![rule(&VERBS, &[GROUP], &[RESOURCE], &["one"])], all.clone()),
            // The wrong group (core has no leases) or resource.
            (vec![rule(&VERBS, &[""], &[RESOURCE], &[])], all.clone()),
            (vec![rule(&VERBS, &[GROUP], &["configmaps"], &[])], all.clone()),
            // Split over rules, one verb left out.
            (
                vec![rule(&["get", "list", "watch", "patch"], &[GROUP], &[RESOURCE], &[]), rule(&["create", "update", "delete"], &[GROUP], &[RESOURCE], &[])],
                vec!["deletecollection"],
            ),
        ];
        for (i, (rules, want)) in table.into_iter().enumerate() {
            assert_eq!(missing(&rules), want, "row {i}");
        }
    }
}
