//! Opening a store from a URL.
//!
//! | URL | backend |
//! |---|---|
//! | `s3://bucket[/prefix]` | S3 and S3-compatibles (R2, MinIO, ...); endpoint from `--endpoint`, `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`; credentials and region resolved by aws-config as the AWS CLI does |
//! | `az://container[/prefix]` | Azure Blob; account and keys from `AZURE_*` variables, Azurite with `AZURE_STORAGE_USE_EMULATOR=true` |
//! | `gs://bucket[/prefix]` | Google Cloud Storage; credentials from `GOOGLE_*` variables |
//! | `file:///abs/dir` | laptop mode: [`LocalDirStore`] |
//! | `memory://` | in-process only ([`super::MemoryStore`]); for tests, demos and the spike |

use super::{LocalDirStore, ObjectStoreBackend, Store};
use crate::error::Error;
#[cfg(feature = "aws")]
use object_store::CredentialProvider;
#[cfg(feature = "aws")]
use object_store::aws::{AmazonS3Builder, AwsCredential};
#[cfg(feature = "azure")]
use object_store::azure::MicrosoftAzureBuilder;
#[cfg(any(feature = "aws", feature = "azure", feature = "gcp"))]
use object_store::client::SpawnedReqwestConnector;
#[cfg(feature = "gcp")]
use object_store::gcp::GoogleCloudStorageBuilder;
#[cfg(any(feature = "aws", feature = "azure", feature = "gcp"))]
use object_store::{ClientOptions, RetryConfig};
use std::sync::Arc;
use std::time::Duration;

/// Options for [`open_store`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// S3 endpoint override (e.g. `http://127.0.0.1:9000` for MinIO).
    pub endpoint: Option<String>,
    /// Per-request timeout. Keep it well under the lease TTL: a renew that
    /// hangs longer than the remaining validity is useless.
    pub request_timeout: Duration,
    /// Where the HTTP stores (S3, Azure, GCS) do their socket work; `None`:
    /// on the runtime of whichever task sends the request. The daemon gives
    /// its renew thread (`crate::fleet::renew_thread`), so that a renewal's
    /// request never waits for a connection driven by the pull loop's busy
    /// runtime. The local store ignores it.
    pub io_runtime: Option<tokio::runtime::Handle>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            endpoint: None,
            request_timeout: Duration::from_secs(5),
            io_runtime: None,
        }
    }
}

/// Opens the store named by `url`. The returned store has not been probed:
/// call [`crate::probe::probe`] before trusting it with leases.
pub async fn open_store(url: &str, opts: &OpenOptions) -> Result<Arc<dyn Store>, Error> {
    // Our own map (`super::mem`), not object_store's `InMemory`, which
    // `open_raw` still gives for raw comparisons: it lists from a cursor
    // without copying everything before it.
    if url == "memory://" || url == "memory:" {
        return Ok(Arc::new(super::TracedStore::new(Arc::new(
            super::MemoryStore::new(),
        ))));
    }
    let store: Arc<dyn Store> = match open_raw(url, opts).await? {
        Raw::Local(s) => Arc::new(s),
        Raw::Object {
            store,
            prefix,
            display,
            identity,
        } => {
            let mut b = ObjectStoreBackend::new(store, &prefix, display).with_identity(identity);
            // The probe learns the If-Match form on every start; this is for
            // `--no-probe` runs on a store known to want bare ETags.
            if let Ok(d) = std::env::var("LEASEHOLD_ETAG_DIALECT") {
                let d = d
                    .parse::<super::EtagDialect>()
                    .map_err(|e| Error::invalid("LEASEHOLD_ETAG_DIALECT", e))?;
                b = b.with_etag_dialect(d);
            }
            Arc::new(b)
        }
    };
    Ok(Arc::new(super::TracedStore::new(store)))
}

/// A store as its backend crate exposes it, for measurements that compare
/// leasehold against raw requests (the spike).
pub enum Raw {
    Local(LocalDirStore),
    Object {
        store: Arc<dyn object_store::ObjectStore>,
        prefix: String,
        display: String,
        /// See [`Store::identity`].
        identity: String,
    },
}

/// Opens the backend named by `url` without leasehold's adapter.
pub async fn open_raw(url: &str, opts: &OpenOptions) -> Result<Raw, Error> {
    // Never echo what the URL should not have held (userinfo, a query).
    let shown = super::objstore::redact(url);
    let bad = |reason: &str| Error::invalid("store URL", format!("{shown:?}: {reason}"));
    if url == "memory://" || url == "memory:" {
        return Ok(Raw::Object {
            store: Arc::new(object_store::memory::InMemory::new()),
            prefix: String::new(),
            display: "memory://".into(),
            // Every open is a new in-process store.
            identity: "memory://".into(),
        });
    }
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("expected s3://, az://, gs://, file:// or memory://"))?;
    // Schemes are case-insensitive (RFC 3986): `S3://b` is `s3://b`.
    let scheme_lc = scheme.to_ascii_lowercase();
    let scheme = scheme_lc.as_str();
    if scheme == "file" {
        if !rest.starts_with('/') {
            return Err(bad(
                "file:// needs an absolute path, e.g. file:///tmp/fleet",
            ));
        }
        let store = LocalDirStore::open(rest).map_err(|e| bad(&e.to_string()))?;
        return Ok(Raw::Local(store));
    }
    if rest.contains('?') || rest.contains('@') || rest.contains('#') {
        return Err(bad(
            "credentials and options do not belong in the URL; use the environment",
        ));
    }
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    // `b/p/`, `b//p` and `b/p` name one prefix: empty segments are dropped
    // (object stores would treat them as part of the key, and the host lock
    // would see two stores).
    let prefix = prefix
        .split('/')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/");
    let prefix = prefix.as_str();
    if bucket.is_empty() {
        return Err(bad("missing bucket or container name"));
    }
    if !prefix.is_empty() {
        crate::store::check_prefix(prefix).map_err(|e| bad(&e.to_string()))?;
    }
    if !matches!(scheme, "s3" | "az" | "azure" | "abfs" | "gs" | "gcs") {
        return Err(bad(&format!("unknown scheme {scheme:?}")));
    }
    cloud(scheme, bucket, prefix, opts, &bad).await
}

/// This build has no backend for `scheme`: say which feature would add it
/// (a service that embeds only the wake path builds without them).
#[allow(dead_code)] // unused when every backend is built in
fn missing_backend(scheme: &str, feature: &str) -> Error {
    Error::invalid(
        "store URL",
        format!(
            "this build of leasehold has no {scheme}:// backend (build it with the `{feature}` feature)"
        ),
    )
}

#[cfg(not(any(feature = "aws", feature = "azure", feature = "gcp")))]
async fn cloud(
    scheme: &str,
    _bucket: &str,
    _prefix: &str,
    _opts: &OpenOptions,
    _bad: &(dyn Fn(&str) -> Error + Send + Sync),
) -> Result<Raw, Error> {
    Err(match scheme {
        "s3" => missing_backend("s3", "aws"),
        "gs" | "gcs" => missing_backend("gs", "gcp"),
        _ => missing_backend("az", "azure"),
    })
}

/// The cloud backends, each built in only with its feature.
#[cfg(any(feature = "aws", feature = "azure", feature = "gcp"))]
async fn cloud(
    scheme: &str,
    bucket: &str,
    prefix: &str,
    opts: &OpenOptions,
    bad: &(dyn Fn(&str) -> Error + Send + Sync),
) -> Result<Raw, Error> {
    let client = ClientOptions::new()
        .with_timeout(opts.request_timeout)
        .with_connect_timeout(opts.request_timeout.min(Duration::from_secs(3)));
    let retry = RetryConfig {
        max_retries: 2,
        retry_timeout: opts.request_timeout,
        ..Default::default()
    };
    let display = format!(
        "{scheme}://{bucket}{}{prefix}",
        if prefix.is_empty() { "" } else { "/" }
    );
    let canonical_scheme = match scheme {
        "azure" | "abfs" => "az",
        "gcs" => "gs",
        s => s,
    };
    #[cfg_attr(not(any(feature = "aws", feature = "azure")), allow(unused_mut))]
    let mut identity = format!("{canonical_scheme}://{bucket}/{prefix}");
    let inner: Arc<dyn object_store::ObjectStore> = match scheme {
        #[cfg(not(feature = "aws"))]
        "s3" => return Err(missing_backend("s3", "aws")),
        #[cfg(not(feature = "azure"))]
        "az" | "azure" | "abfs" => return Err(missing_backend("az", "azure")),
        #[cfg(not(feature = "gcp"))]
        "gs" | "gcs" => return Err(missing_backend("gs", "gcp")),
        #[cfg(feature = "aws")]
        "s3" => {
            // Checked before aws-config loads (which may consult IMDS): a bad
            // flag is answered at once, about the flag.
            if let Some(e) = opts.endpoint.as_deref().filter(|e| !e.is_empty()) {
                check_endpoint(e)?;
            }
            let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .load()
                .await;
            let region = sdk
                .region()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "us-east-1".to_string());
            let endpoint = opts
                .endpoint
                .clone()
                .or_else(|| std::env::var("AWS_ENDPOINT_URL_S3").ok())
                .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
                .filter(|e| !e.is_empty());
            if let Some(e) = &endpoint {
                check_endpoint(e)?;
            }
            let mut b = AmazonS3Builder::new()
                .with_bucket_name(bucket)
                .with_region(region)
                .with_client_options(client)
                .with_retry(retry);
            if let Some(rt) = &opts.io_runtime {
                b = b.with_http_connector(SpawnedReqwestConnector::new(rt.clone()));
            }
            identity = format!(
                "s3://{}/{bucket}/{prefix}",
                endpoint.as_deref().map_or_else(
                    || "aws".to_string(),
                    |e| super::objstore::redact(e.trim_end_matches('/')).to_ascii_lowercase()
                )
            );
            if let Some(ep) = endpoint {
                b = b
                    .with_allow_http(ep.starts_with("http://"))
                    .with_endpoint(ep);
            }
            let provider = sdk.credentials_provider().ok_or_else(|| {
                Error::invalid("S3 credentials", "aws-config found no credentials provider")
            })?;
            b = b.with_credentials(Arc::new(AwsConfigCredentials::new(provider)));
            Arc::new(b.build().map_err(|e| bad(&e.to_string()))?)
        }
        #[cfg(feature = "azure")]
        "az" | "azure" | "abfs" => {
            let account = std::env::var("AZURE_STORAGE_ACCOUNT_NAME")
                .or_else(|_| std::env::var("AZURE_STORAGE_ACCOUNT"))
                .unwrap_or_else(|_| "default".into());
            identity = format!("az://{account}/{bucket}/{prefix}");
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_container_name(bucket)
                // Azure's builder reads AZURE_ALLOW_HTTP into client options
                // that ours replace (the emulator allows http by itself):
                // carry it over.
                .with_client_options(
                    client
                        .with_allow_http(std::env::var("AZURE_ALLOW_HTTP").is_ok_and(|v| {
                            matches!(v.to_ascii_lowercase().as_str(), "1" | "true")
                        })),
                )
                .with_retry(retry);
            if let Some(rt) = &opts.io_runtime {
                b = b.with_http_connector(SpawnedReqwestConnector::new(rt.clone()));
            }
            Arc::new(
                b.build()
                    .map_err(|e| bad(&super::objstore::redact(&e.to_string())))?,
            )
        }
        // The GCS builder's own client options allow http (its base URL,
        // `GOOGLE_BASE_URL` or the credentials' `gcs_base_url`, decides the
        // scheme); ours replace them, so keep that, or an emulator on
        // http://127.0.0.1 fails before sending anything.
        #[cfg(feature = "gcp")]
        "gs" | "gcs" => {
            let mut b = GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_client_options(client.with_allow_http(true))
                .with_retry(retry);
            if let Some(rt) = &opts.io_runtime {
                b = b.with_http_connector(SpawnedReqwestConnector::new(rt.clone()));
            }
            Arc::new(
                b.build()
                    .map_err(|e| bad(&super::objstore::redact(&e.to_string())))?,
            )
        }
        other => return Err(bad(&format!("unknown scheme {other:?}"))),
    };
    Ok(Raw::Object {
        store: inner,
        prefix: prefix.to_string(),
        display,
        identity,
    })
}

#[cfg(feature = "aws")]
/// An S3 endpoint must be an http(s) URL with a host: object_store would
/// otherwise fail on first use with a bare `InvalidUri`, far from the flag.
fn check_endpoint(e: &str) -> Result<(), Error> {
    let shown = super::objstore::redact(e);
    let ok = url::Url::parse(e)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
    if ok.is_none() {
        return Err(Error::invalid(
            "endpoint",
            format!("{shown:?} is not an http:// or https:// URL (e.g. http://127.0.0.1:9000)"),
        ));
    }
    Ok(())
}

/// Where the store's credentials come from, for `leasehold doctor`: the
/// provider's *name* only (never a key, token or secret), so an operator can
/// tell "my instance role" from "a stale AWS_ACCESS_KEY_ID in my shell".
///
/// For S3 this resolves credentials through the same aws-config chain the
/// store uses and reports which link of the chain answered (aws-config tags
/// every credential with the features that produced it). For Azure and GCS it
/// reports which documented variables are set, in the order object_store's
/// builders consult them. A failure to resolve is reported as text, not as an
/// error: doctor's job is to explain, and the probe reports the failure itself.
pub async fn credentials_source(url: &str) -> String {
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    let scheme = scheme.as_str();
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty());
    match scheme {
        "memory" | "file" | "" => "none needed".to_string(),
        #[cfg(not(feature = "aws"))]
        "s3" => "this build has no s3:// backend".to_string(),
        #[cfg(feature = "aws")]
        "s3" => {
            use aws_credential_types::provider::ProvideCredentials;
            let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .load()
                .await;
            let Some(provider) = sdk.credentials_provider() else {
                return "none: aws-config found no credentials provider".to_string();
            };
            match provider.provide_credentials().await {
                Ok(c) => {
                    let features = c
                        .get_property::<Vec<aws_credential_types::credential_feature::AwsCredentialFeature>>()
                        .map(|f| f.as_slice())
                        .unwrap_or(&[]);
                    let mut source = aws_source(features);
                    if let Ok(profile) = std::env::var("AWS_PROFILE")
                        && source.starts_with("profile")
                    {
                        source = format!("{source} ({profile})");
                    }
                    source
                }
                Err(e) => {
                    // The chain's own error is terse ("no providers in chain
                    // provided credentials"); its sources say why.
                    let mut text = e.to_string();
                    let mut src = std::error::Error::source(&e);
                    while let Some(s) = src {
                        text.push_str(": ");
                        text.push_str(&s.to_string());
                        src = s.source();
                    }
                    format!("none resolved: {}", super::objstore::redact(&text))
                }
            }
        }
        "az" | "azure" | "abfs" => {
            if std::env::var("AZURE_STORAGE_USE_EMULATOR").is_ok_and(|v| v == "true") {
                "Azurite emulator (AZURE_STORAGE_USE_EMULATOR, well-known development key)".into()
            } else if set("AZURE_STORAGE_ACCOUNT_KEY") || set("AZURE_STORAGE_ACCESS_KEY") {
                "account key (AZURE_STORAGE_ACCOUNT_KEY)".into()
            } else if set("AZURE_STORAGE_SAS_KEY") || set("AZURE_STORAGE_SAS_TOKEN") {
                "SAS token (AZURE_STORAGE_SAS_KEY)".into()
            } else if set("AZURE_CLIENT_SECRET") {
                "service principal secret (AZURE_CLIENT_ID, AZURE_CLIENT_SECRET)".into()
            } else if set("AZURE_FEDERATED_TOKEN_FILE") {
                "workload identity (AZURE_FEDERATED_TOKEN_FILE)".into()
            } else {
                "managed identity (instance metadata; no AZURE_* credential variables set)".into()
            }
        }
        "gs" | "gcs" => {
            if set("GOOGLE_SERVICE_ACCOUNT") || set("GOOGLE_SERVICE_ACCOUNT_PATH") {
                "service account file (GOOGLE_SERVICE_ACCOUNT)".into()
            } else if set("GOOGLE_SERVICE_ACCOUNT_KEY") {
                "service account key (GOOGLE_SERVICE_ACCOUNT_KEY)".into()
            } else if set("GOOGLE_APPLICATION_CREDENTIALS") {
                "application default credentials (GOOGLE_APPLICATION_CREDENTIALS)".into()
            } else {
                "application default credentials (gcloud file or instance metadata)".into()
            }
        }
        other => format!("unknown scheme {other:?}"),
    }
}

#[cfg(feature = "aws")]
/// Names the link of aws-config's chain that produced a credential, from the
/// features it tagged the credential with (the most specific tag wins).
fn aws_source(
    features: &[aws_credential_types::credential_feature::AwsCredentialFeature],
) -> String {
    use aws_credential_types::credential_feature::AwsCredentialFeature as F;
    let has = |f: F| features.contains(&f);
    let name = if has(F::CredentialsEnvVarsStsWebIdToken) {
        "web identity token from the environment (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN)"
    } else if has(F::CredentialsProfileStsWebIdToken) {
        "profile: web identity token"
    } else if has(F::CredentialsProfileSso) || has(F::CredentialsSso) {
        "profile: SSO session"
    } else if has(F::CredentialsProfileProcess) || has(F::CredentialsProcess) {
        "profile: credential_process"
    } else if has(F::CredentialsProfileSourceProfile) || has(F::CredentialsStsAssumeRole) {
        "profile: assumed role (source_profile)"
    } else if has(F::CredentialsProfileNamedProvider) {
        "profile: credential_source"
    } else if has(F::CredentialsProfileLogin) || has(F::CredentialsLogin) {
        "profile: console login"
    } else if has(F::CredentialsProfile) {
        "profile: static keys in the shared config/credentials files"
    } else if has(F::CredentialsEnvVars) {
        "environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
    } else if has(F::CredentialsHttp) {
        "container credentials endpoint (ECS/EKS pod identity)"
    } else if has(F::CredentialsImds) {
        "instance metadata (IMDS instance role)"
    } else if has(F::CredentialsCode) {
        "set in code"
    } else {
        "resolved by aws-config (provider not tagged)"
    };
    name.to_string()
}

/// Bridges aws-config's credential chain (environment, profiles, SSO, web
/// identity, container and instance metadata) into object_store, caching each
/// credential until shortly before it expires.
#[cfg(feature = "aws")]
#[derive(Debug)]
struct AwsConfigCredentials {
    provider: aws_credential_types::provider::SharedCredentialsProvider,
    cache: tokio::sync::Mutex<Option<(Arc<AwsCredential>, Option<std::time::SystemTime>)>>,
}

#[cfg(feature = "aws")]
impl AwsConfigCredentials {
    fn new(provider: aws_credential_types::provider::SharedCredentialsProvider) -> Self {
        AwsConfigCredentials {
            provider,
            cache: tokio::sync::Mutex::new(None),
        }
    }
}

#[cfg(feature = "aws")]
#[async_trait::async_trait]
impl CredentialProvider for AwsConfigCredentials {
    type Credential = AwsCredential;

    #[allow(clippy::disallowed_methods)] // credential expiry is wall-clock by nature
    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        use aws_credential_types::provider::ProvideCredentials;
        let mut cache = self.cache.lock().await;
        if let Some((cred, expiry)) = cache.as_ref() {
            let fresh = match expiry {
                None => true,
                Some(t) => std::time::SystemTime::now() + Duration::from_secs(300) < *t,
            };
            if fresh {
                return Ok(cred.clone());
            }
        }
        let c = self.provider.provide_credentials().await.map_err(|e| {
            object_store::Error::Generic {
                store: "S3",
                // The error names the provider that failed, never a secret.
                source: format!("resolving AWS credentials: {e}").into(),
            }
        })?;
        let cred = Arc::new(AwsCredential {
            key_id: c.access_key_id().to_string(),
            secret_key: c.secret_access_key().to_string(),
            token: c.session_token().map(str::to_string),
        });
        *cache = Some((cred.clone(), c.expiry()));
        Ok(cred)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn err(url: &str) -> String {
        match open_store(url, &OpenOptions::default()).await {
            Ok(s) => panic!("{url} opened as {s}"),
            Err(e) => {
                assert_eq!(e.kind(), crate::ErrorKind::Invalid, "{e}");
                e.to_string()
            }
        }
    }

    #[tokio::test]
    async fn urls() {
        assert_eq!(
            open_store("memory://", &OpenOptions::default())
                .await
                .unwrap()
                .to_string(),
            "memory://"
        );
        let d = tempfile::tempdir().unwrap();
        let url = format!("file://{}", d.path().display());
        assert_eq!(
            open_store(&url, &OpenOptions::default())
                .await
                .unwrap()
                .to_string(),
            url
        );
        // GCS and Azure build without contacting anything; names keep the prefix.
        let gs = open_store("gs://bucket/fleet-a", &OpenOptions::default()).await;
        assert_eq!(gs.unwrap().to_string(), "gs://bucket/fleet-a");
        assert!(err("ftp://x").await.contains("unknown scheme"));
        assert!(err("nothing").await.contains("expected s3://"));
        assert!(err("file://rel/dir").await.contains("absolute"));
        assert!(err("s3://").await.contains("missing bucket"));
        assert!(err("s3://b/a/../x").await.contains(".."));
        for secret in ["s3://key:secret@b", "az://c?sig=abc", "gs://b#frag"] {
            let m = err(secret).await;
            assert!(m.contains("do not belong in the URL"), "{m}");
        }
    }
}
