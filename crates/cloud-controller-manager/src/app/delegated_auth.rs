//! Delegated authentication and authorization for the secure endpoint, as upstream's
//! `DelegatingAuthenticationOptions` / `DelegatingAuthorizationOptions` do: the bearer token is checked
//! with a TokenReview, the request with a SubjectAccessReview; `system:masters` is always allowed.
//! Decisions are cached for 10 s (upstream's webhook cache TTLs).

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};

const CACHE_TTL: Duration = Duration::from_secs(10);

/// What the API server decided about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Go ahead.
    Allowed,
    /// The token is not valid (401).
    Unauthenticated,
    /// The caller may not do this (403), with upstream's message.
    Forbidden(String),
    /// The API server could not be asked (500).
    Failed(String),
}

/// A cached decision's key: (token, path, verb).
type RequestKey = (Option<String>, String, String);

/// Asks the API server who a caller is and what they may do.
pub struct DelegatedAuth {
    client: Client,
    cache: Mutex<HashMap<RequestKey, (Instant, Decision)>>,
}

impl DelegatedAuth {
    /// Reviews through `client` (the manager's own identity, which needs `create` on tokenreviews and
    /// subjectaccessreviews).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::default(),
        }
    }

    /// Decides whether the bearer of `token` (anonymous without one) may `verb` the non-resource `path`.
    pub async fn decide(&self, token: Option<&str>, path: &str, verb: &str) -> Decision {
        let key = (token.map(str::to_owned), path.to_owned(), verb.to_owned());
        if let Some((at, decision)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            && at.elapsed() < CACHE_TTL
        {
            return decision.clone();
        }
        let decision = self.review(token, path, verb).await;
        if !matches!(decision, Decision::Failed(_)) {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.retain(|_, (at, _)| at.elapsed() < CACHE_TTL);
            cache.insert(key, (Instant::now(), decision.clone()));
        }
        decision
    }

    async fn review(&self, token: Option<&str>, path: &str, verb: &str) -> Decision {
        let (user, uid, groups, extra) = match token {
            None => (
                "system:anonymous".to_owned(),
                None,
                vec!["system:unauthenticated".to_owned()],
                None,
            ),
            Some(token) => {
                let review = TokenReview {
                    metadata: ObjectMeta::default(),
                    spec: TokenReviewSpec {
                        token: token.to_owned(),
                        audiences: None,
                    },
                    status: None,
                };
                let reviewed = match Api::<TokenReview>::all(self.client.clone())
                    .create(&PostParams::default(), &review)
                    .await
                {
                    Ok(reviewed) => reviewed,
                    Err(err) => return Decision::Failed(format!("token review failed: {err}")),
                };
                let status = reviewed.status.unwrap_or_default();
                let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
                    return Decision::Unauthenticated;
                };
                (
                    user.username.unwrap_or_default(),
                    user.uid,
                    user.groups.unwrap_or_default(),
                    user.extra,
                )
            }
        };
        if groups.iter().any(|g| g == "system:masters") {
            return Decision::Allowed;
        }
        let review = SubjectAccessReview {
            metadata: ObjectMeta::default(),
            spec: SubjectAccessReviewSpec {
                user: Some(user.clone()),
                uid,
                groups: Some(groups),
                extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some(verb.to_owned()),
                }),
                resource_attributes: None,
            },
            status: None,
        };
        match Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(reviewed) if reviewed.status.as_ref().is_some_and(|s| s.allowed) => {
                Decision::Allowed
            }
            Ok(_) => Decision::Forbidden(format!(
                "forbidden: User \"{user}\" cannot {verb} path \"{path}\""
            )),
            Err(err) => Decision::Failed(format!("subject access review failed: {err}")),
        }
    }
}
