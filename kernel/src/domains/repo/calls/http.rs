//! `git clone http://HOST/repos/<owner>/<name>.git`: git's smart HTTP,
//! served by git's own `git http-backend` run as a CGI program per
//! request. The kernel only authenticates (HTTP Basic with the user's name
//! and one of their tokens; public repositories also anonymously), checks
//! read access as `repo.read` does, and relays bytes. Pushes are refused:
//! writes go through `repo.apply`, one checked commit at a time.

use std::process::Stdio;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use super::store_of;
use crate::caps::has_capability;
use crate::domains::accounts;
use crate::domains::repo::names::Slug;
use crate::domains::repo::{Caller, can_read};
use crate::kernel::Kernel;

/// The one service offered: fetch/clone.
const UPLOAD_PACK: &str = "git-upload-pack";
/// Largest CGI header block accepted from `git http-backend`.
const MAX_CGI_HEADER: usize = 64 * 1024;

/// `/repos/{owner}/{repo}/{*rest}` (any method).
pub async fn serve(
    State(k): State<Arc<Kernel>>,
    Path((owner, repo_dir, rest)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let name = repo_dir.strip_suffix(".git").unwrap_or(&repo_dir);
    let Ok(slug) = Slug::parse(&format!("{owner}/{name}")) else {
        return plain(StatusCode::NOT_FOUND, "no such repository");
    };
    let query = query.unwrap_or_default();
    let service_ok = match rest.as_str() {
        "info/refs" => query
            .split('&')
            .any(|p| p == format!("service={UPLOAD_PACK}")),
        r => r == UPLOAD_PACK,
    };
    if !service_ok {
        return plain(
            StatusCode::FORBIDDEN,
            "only fetch and clone are served here; write with repo.apply",
        );
    }
    let caller = match caller_of(&k, &headers).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    let allowed = match &caller {
        Some(c) => {
            has_capability(&c.capabilities, "repo.read")
                && can_read(k.db(), c, &slug).await.unwrap_or(false)
        }
        None => public_anonymously(&k, &slug).await,
    };
    let store = store_of(&k);
    if !allowed || !store.exists(&slug) {
        if caller.is_none() {
            return challenge();
        }
        return plain(StatusCode::NOT_FOUND, "no such repository");
    }
    let user = caller.map(|c| c.identity.username);
    let path_info = format!("/{}/{}.git/{rest}", slug.owner, slug.name);
    match run_backend(&k, &path_info, &query, &method, &headers, body, user).await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::error!(repo = %slug, error = %e, "git http-backend failed");
            plain(StatusCode::INTERNAL_SERVER_ERROR, "git http-backend failed")
        }
    }
}

async fn public_anonymously(k: &Kernel, slug: &Slug) -> bool {
    let nobody = Caller {
        identity: accounts::ProcessIdentity {
            uid: -1,
            gid: -1,
            gids: Vec::new(),
            username: String::new(),
            home: String::new(),
            cwd: String::new(),
        },
        capabilities: Vec::new(),
    };
    can_read(k.db(), &nobody, slug).await.unwrap_or(false)
}

/// The caller a Basic `Authorization` names (`None`: no credentials).
/// The password must be a live user token of that user.
async fn caller_of(k: &Kernel, headers: &HeaderMap) -> Result<Option<Caller>, Response> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let decoded = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|b| String::from_utf8(b).ok());
    let Some((username, token)) = decoded.as_deref().and_then(|d| d.split_once(':')) else {
        return Err(challenge());
    };
    let (username, token) = (username.to_owned(), token.to_owned());
    let found = k
        .db()
        .call(move |c| {
            let Some(t) = accounts::authenticate_token(c, &token)? else {
                return Ok(None);
            };
            if t.allowed_role.as_deref().is_some_and(|r| r != "user") {
                return Ok(None);
            }
            let Some(identity) = accounts::identity_by_uid(c, t.uid)? else {
                return Ok(None);
            };
            if identity.username != username {
                return Ok(None);
            }
            let capabilities = accounts::capabilities(c, &identity.gids)?;
            Ok(Some(Caller {
                identity,
                capabilities,
            }))
        })
        .await;
    match found {
        Ok(Some(c)) => Ok(Some(c)),
        Ok(None) => Err(challenge()),
        Err(e) => {
            tracing::error!(error = %e, "http clone authentication");
            Err(plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "authentication failed",
            ))
        }
    }
}

fn challenge() -> Response {
    let mut r = plain(StatusCode::UNAUTHORIZED, "authentication required");
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"gsv\""),
    );
    r
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
}

#[derive(Debug, thiserror::Error)]
enum BackendError {
    #[error("starting git http-backend: {0}")]
    Spawn(std::io::Error),
    #[error("reading its output: {0}")]
    Read(std::io::Error),
    #[error("its CGI headers: {0}")]
    Headers(String),
}

/// Runs `git http-backend` for one request (RFC 3875 variables in, a CGI
/// response out) and streams its answer back.
async fn run_backend(
    k: &Kernel,
    path_info: &str,
    query: &str,
    method: &Method,
    headers: &HeaderMap,
    body: Body,
    user: Option<String>,
) -> Result<Response, BackendError> {
    let header_str = |name: HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let mut cmd = Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        // Neither the machine's nor the kernel user's git config applies.
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", k.config().data_dir.join("repos"))
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("REQUEST_METHOD", method.as_str())
        .env("PATH_INFO", path_info)
        .env("QUERY_STRING", query)
        .env("CONTENT_TYPE", header_str(header::CONTENT_TYPE))
        .env(
            "HTTP_CONTENT_ENCODING",
            header_str(header::CONTENT_ENCODING),
        )
        .env(
            "HTTP_GIT_PROTOCOL",
            header_str(HeaderName::from_static("git-protocol")),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
    {
        cmd.env("CONTENT_LENGTH", len);
    }
    if let Some(u) = user {
        cmd.env("REMOTE_USER", u);
    }
    let mut child = cmd.spawn().map_err(BackendError::Spawn)?;
    let mut stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    tokio::spawn(async move {
        let mut data = body.into_data_stream();
        while let Some(Ok(chunk)) = data.next().await {
            if stdin.write_all(&chunk).await.is_err() {
                return;
            }
        }
        // Dropping stdin closes it: the backend sees the end of the request.
    });
    let mut out = BufReader::new(stdout);
    let mut head = Vec::new();
    loop {
        let n = out
            .read_until(b'\n', &mut head)
            .await
            .map_err(BackendError::Read)?;
        if n == 0 || head.ends_with(b"\n\n") || head.ends_with(b"\r\n\r\n") {
            break;
        }
        if head.len() > MAX_CGI_HEADER {
            return Err(BackendError::Headers("too long".into()));
        }
    }
    let mut parsed = [httparse::EMPTY_HEADER; 32];
    let parsed = match httparse::parse_headers(&head, &mut parsed) {
        Ok(httparse::Status::Complete((_, h))) => h,
        Ok(httparse::Status::Partial) => return Err(BackendError::Headers("incomplete".into())),
        Err(e) => return Err(BackendError::Headers(e.to_string())),
    };
    let mut response = Response::builder().status(StatusCode::OK);
    for h in parsed.iter() {
        if h.name.eq_ignore_ascii_case("Status") {
            let code = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.split_whitespace().next())
                .and_then(|c| c.parse::<u16>().ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .ok_or_else(|| BackendError::Headers("bad Status".into()))?;
            response = response.status(code);
        } else {
            response = response.header(h.name, h.value);
        }
    }
    // The child is reaped once its output has been relayed.
    let stream = futures::stream::unfold((out, Some(child)), |(mut out, child)| async move {
        let mut buf = vec![0u8; 64 * 1024];
        match out.read(&mut buf).await {
            Ok(0) | Err(_) => {
                if let Some(mut c) = child {
                    let _ = c.wait().await;
                }
                None
            }
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(buf), (out, child)))
            }
        }
    });
    response
        .body(Body::from_stream(stream))
        .map_err(|e| BackendError::Headers(e.to_string()))
}
