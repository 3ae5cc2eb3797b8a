//! Delegated authentication and authorization for the secure endpoint, as upstream's
//! `DelegatingAuthenticationOptions` / `DelegatingAuthorizationOptions` do: the bearer token is checked
//! with a TokenReview, the request with a SubjectAccessReview; `system:masters` is always allowed; a
//! request without a token is `system:anonymous` in `system:unauthenticated`.
//!
//! Reviews cost API requests, and anyone who reaches the port can ask for them, so:
//!
//! - they go through a client of their own (upstream's 200 QPS, burst 400), apart from the leader
//!   elector's and the controllers' (see `client_factory`), so a flood of them never delays a Lease
//!   renewal or a controller's work in the manager;
//! - at most a few are in flight at once ([`ReviewSlots`]); a request that finds none free within a
//!   short wait is refused with 429, so nothing queues without bound;
//! - answers are cached for 10 s (upstream's TTLs), at most 8,192 of each kind (upstream's webhook
//!   authorizer's LRU size): token answers by the token's SHA-256 (upstream's token cache keys by a hash
//!   too), valid or not;
//! - access answers by **(user, UID, groups, extra, request class)**. Upstream's authorizer keys its cache
//!   by the whole SubjectAccessReview spec, path included, so each new path costs a review: that is what
//!   let anonymous requests with new paths take the leader's Lease (issue #32). Here the class of a
//!   request the endpoint answers with content (`GET`/`HEAD` of `/metrics`, `/dry-run`, a health endpoint
//!   or one of its checks) is its verb and path, as upstream. Every other request (an unknown path, an
//!   unknown check, another verb) is one class per user: the review is made with the first such
//!   request's verb and path, and its answer stands for all of them for the TTL. Such a request gets 403
//!   when denied and 404 or 405 when allowed; either way it reveals nothing, so the answer to a
//!   different unserved path could change only which of those empty codes a caller sees. A flood of new
//!   paths, anonymous or with one token, costs one review per 10 s.
//!
//! New tokens still cost one TokenReview each (a new token may be valid); the slots and the client's
//! rate bound what that costs.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};

use super::{
    review_cache::ExpiringCache,
    review_slots::{ReviewSlots, SlotError},
};

/// How long an answer is cached (upstream's token and authorization cache TTLs, allowed and denied).
pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// The most answers of each kind kept (upstream's webhook authorizer's cache size).
pub const CACHE_ENTRIES: usize = 8192;

/// What the API server decided about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Go ahead.
    Allowed,
    /// The token is not valid (401).
    Unauthenticated,
    /// The caller may not do this (403), with upstream's message.
    Forbidden(String),
    /// Too many reviews in flight to review this one now (429).
    TooManyRequests,
    /// The API server could not be asked (500).
    Failed(String),
}

/// What a request asks for, as the authorizer sees it.
#[derive(Debug, Clone, Copy)]
pub struct RequestAttributes<'a> {
    /// The verb: the request's method in lower case, as upstream's for non-resource requests.
    pub verb: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// Whether the endpoint answers this verb and path with content (see the module's docs).
    pub served: bool,
}

/// Who the API server says a caller is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct UserInfo {
    name: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: Option<BTreeMap<String, Vec<String>>>,
}

impl UserInfo {
    fn anonymous() -> Self {
        Self {
            name: "system:anonymous".to_owned(),
            uid: None,
            groups: vec!["system:unauthenticated".to_owned()],
            extra: None,
        }
    }
}

/// A token's answer: who it belongs to, or `None` when it is not valid.
type TokenAnswer = Option<UserInfo>;

/// A request's class: its verb and path when the endpoint serves them, else one class for all.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum RequestClass {
    Served { verb: String, path: String },
    Unserved,
}

impl RequestClass {
    fn of(request: &RequestAttributes<'_>) -> Self {
        if request.served {
            Self::Served {
                verb: request.verb.to_owned(),
                path: request.path.to_owned(),
            }
        } else {
            Self::Unserved
        }
    }
}

/// An access answer's key.
type AccessKey = (UserInfo, RequestClass);

/// Asks the API server who a caller is and what they may do.
pub struct DelegatedAuth {
    client: Client,
    tokens: ExpiringCache<[u8; 32], TokenAnswer>,
    access: ExpiringCache<AccessKey, bool>,
    slots: ReviewSlots,
}

impl DelegatedAuth {
    /// Reviews through `client` (the manager's own identity, which needs `create` on tokenreviews and
    /// subjectaccessreviews; a client of the reviews' own, see the module's docs).
    pub fn new(client: Client) -> Self {
        Self::with_slots(client, ReviewSlots::default())
    }

    /// Reviews through `client`, with `slots` bounding the reviews in flight.
    pub fn with_slots(client: Client, slots: ReviewSlots) -> Self {
        Self {
            client,
            tokens: ExpiringCache::new(CACHE_TTL, CACHE_ENTRIES),
            access: ExpiringCache::new(CACHE_TTL, CACHE_ENTRIES),
            slots,
        }
    }

    /// Decides whether the bearer of `token` (anonymous without one, or with an empty one, as upstream)
    /// may make `request`.
    pub async fn decide(&self, token: Option<&str>, request: &RequestAttributes<'_>) -> Decision {
        let user = match token.filter(|t| !t.is_empty()) {
            None => UserInfo::anonymous(),
            Some(token) => match self.authenticate(token).await {
                Ok(Some(user)) => user,
                Ok(None) => return Decision::Unauthenticated,
                Err(decision) => return decision,
            },
        };
        if user.groups.iter().any(|g| g == "system:masters") {
            return Decision::Allowed;
        }
        match self.authorize(&user, request).await {
            Ok(true) => Decision::Allowed,
            Ok(false) => Decision::Forbidden(format!(
                "forbidden: User \"{}\" cannot {} path \"{}\"",
                user.name, request.verb, request.path
            )),
            Err(decision) => decision,
        }
    }

    /// The token's user (`None`: not valid), cached; the decision to answer when it cannot be had.
    async fn authenticate(&self, token: &str) -> Result<TokenAnswer, Decision> {
        let key = token_digest(token);
        if let Some(answer) = key.and_then(|key| self.tokens.get(&key)) {
            return Ok(answer);
        }
        let review = TokenReview {
            metadata: ObjectMeta::default(),
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            status: None,
        };
        let reviewed = self.create_review("token review", &review).await?;
        let status = reviewed.status.unwrap_or_default();
        let answer = status
            .user
            .filter(|_| status.authenticated == Some(true))
            .map(|user| UserInfo {
                name: user.username.unwrap_or_default(),
                uid: user.uid,
                groups: user.groups.unwrap_or_default(),
                extra: user.extra,
            });
        if let Some(key) = key {
            self.tokens.insert(key, answer.clone());
        }
        Ok(answer)
    }

    /// Whether `user` may make `request`, cached by the request's class.
    async fn authorize(
        &self,
        user: &UserInfo,
        request: &RequestAttributes<'_>,
    ) -> Result<bool, Decision> {
        let key = (user.clone(), RequestClass::of(request));
        if let Some(allowed) = self.access.get(&key) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            metadata: ObjectMeta::default(),
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(request.path.to_owned()),
                    verb: Some(request.verb.to_owned()),
                }),
                resource_attributes: None,
            },
            status: None,
        };
        let reviewed = self.create_review("subject access review", &review).await?;
        let allowed = reviewed.status.is_some_and(|s| s.allowed);
        self.access.insert(key, allowed);
        Ok(allowed)
    }

    /// Creates `review` in a slot and answers the API server's verdict; `what` names the review in
    /// the errors. A review that could not be made (no slot: 429), was not answered in time or failed
    /// (500) is the decision itself.
    async fn create_review<R>(&self, what: &str, review: &R) -> Result<R, Decision>
    where
        R: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
    {
        let api = Api::<R>::all(self.client.clone());
        match self
            .slots
            .run(api.create(&PostParams::default(), review))
            .await
        {
            Ok(Ok(reviewed)) => Ok(reviewed),
            Ok(Err(err)) => Err(Decision::Failed(format!("{what} failed: {err}"))),
            Err(SlotError::Busy(_)) => Err(Decision::TooManyRequests),
            Err(err @ SlotError::TimedOut(_)) => {
                Err(Decision::Failed(format!("{what} failed: {err}")))
            }
        }
    }
}

/// The token's SHA-256, the key of its cached answer, so the cache holds no tokens (and no more than
/// 32 bytes for a token of any size). `None` (never, in practice) means the answer is not cached.
fn token_digest(token: &str) -> Option<[u8; 32]> {
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256.tls13()?;
    suite
        .common
        .hash_provider
        .hash(token.as_bytes())
        .as_ref()
        .try_into()
        .ok()
}
