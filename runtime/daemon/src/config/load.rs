//! Loading: every section of the file checked by a function of its own,
//! environment variables applied over it, every problem collected.

use std::collections::HashMap;
use std::net::SocketAddr;

use flow_runtime::llm::{check_api_key, check_http_url};

use super::parse::{Place, Problems, Span, read_file};
use super::*;

/// Reads the configuration from `text` (the file `path`, for messages), then
/// applies overrides from `env`. Returns every problem found.
pub fn load(path: &str, text: &str, environment: &Environment) -> Result<Config, Vec<Problem>> {
    let mut problems = Problems {
        path,
        text,
        list: Vec::new(),
    };
    let Some(file) = read_file(&mut problems) else {
        return Err(problems.list);
    };
    let server = server_settings(&file, environment, &mut problems);
    let mut limits = limits_section(file.limits, environment, &mut problems);
    let mcp = mcp_section(file.mcp, &mut problems);
    let smtp = smtp_section(file.smtp, environment, &mut problems);
    let provider = provider_with_env(file.provider, environment, &mut problems);
    llm_concurrency_from_env(&mut limits, environment, &mut problems);
    let mut accounts = Vec::new();
    let mut key_owner: HashMap<String, String> = HashMap::new();
    for account in file.accounts {
        let account = account_section(account, &accounts, &mut key_owner, &mcp, &mut problems);
        accounts.push(account);
    }
    // A webhook of no account received every account's runs, inputs and
    // outputs included.
    for webhook in &file.webhooks {
        problems.at(
            webhook.span(),
            "webhooks belong to an account: write this [[webhooks]] as [[accounts.webhooks]] (with a `name`) under the [[accounts]] entry whose runs it receives"
                .to_string(),
        );
    }

    let store = store_location(&file.store, environment, &mut problems);
    if !problems.list.is_empty() {
        return Err(problems.list);
    }
    Ok(Config {
        listen: server
            .listen
            .expect("a listen address without a problem parsed"),
        store,
        public_url: server.public_url,
        link_secret: Secret(server.link_secret),
        previous_link_secrets: server.previous_link_secrets,
        smtp,
        provider,
        accounts,
        otlp_endpoint: server.otlp_endpoint,
        metrics_token: server.metrics_token,
        limits,
        mcp,
    })
}

/// The top-level settings: where flowd listens and is reached, its keys.
struct ServerSettings {
    listen: Option<SocketAddr>,
    public_url: Option<String>,
    link_secret: String,
    previous_link_secrets: Vec<Secret>,
    otlp_endpoint: Option<String>,
    metrics_token: Option<Secret>,
}

/// A setting of the file, or the environment variable `name` over it; a
/// value from the environment has no span: its problems name the variable.
fn setting(
    environment: &Environment,
    name: &str,
    file_value: &Option<toml::Spanned<String>>,
) -> Option<(String, Place)> {
    match environment.get(name) {
        Some(value) => Some((value, Place::Env(name.to_string()))),
        None => file_value
            .as_ref()
            .map(|v| (v.get_ref().clone(), Place::File(v.span()))),
    }
}

fn server_settings(
    file: &File,
    environment: &Environment,
    problems: &mut Problems,
) -> ServerSettings {
    let listen_setting = setting(environment, "FLOWD_LISTEN", &file.listen);
    let public_setting = setting(environment, "FLOWD_PUBLIC_URL", &file.public_url);
    let secret_setting = setting(environment, "FLOWD_LINK_SECRET", &file.link_secret);
    let otlp_setting = setting(environment, "FLOWD_OTLP_ENDPOINT", &file.otlp_endpoint);
    let metrics_setting = setting(environment, "FLOWD_METRICS_TOKEN", &file.metrics_token);
    let listen = match listen_setting {
        None => DEFAULT_LISTEN.parse().ok(),
        Some((value, place)) => match value.parse::<SocketAddr>() {
            Ok(address) => Some(address),
            Err(_) => {
                problems.report(
                    place,
                    format!("`{value}` is not a listen address; write it as `127.0.0.1:8080`"),
                );
                None
            }
        },
    };
    let public_url = public_setting.map(|(value, place)| {
        if let Err(message) = check_http_url(&value) {
            problems.report(place, format!("public_url {message}"));
        }
        value.trim_end_matches('/').to_string()
    });
    let link_secret = match secret_setting {
        Some((value, place)) => {
            if value.len() < 32 {
                problems.report(
                    place,
                    "link_secret is shorter than 32 characters: approval links signed with it could be forged".to_string(),
                );
            }
            value
        }
        None => {
            problems.report(
                Place::Whole,
                "no link_secret: approval links need a key of at least 32 characters (set it here or in FLOWD_LINK_SECRET)".to_string(),
            );
            String::new()
        }
    };
    let previous_link_secrets = file
        .previous_link_secrets
        .iter()
        .map(|secret| {
            if secret.get_ref().len() < 32 {
                problems.at(
                    secret.span(),
                    "a previous_link_secrets entry is shorter than 32 characters".to_string(),
                );
            }
            Secret(secret.get_ref().clone())
        })
        .collect();
    let otlp_endpoint = match otlp_setting {
        None => None,
        Some((value, place)) => {
            if let Err(message) = check_http_url(&value) {
                problems.report(place, format!("otlp_endpoint {message}"));
            }
            Some(value)
        }
    };
    let metrics_token = metrics_setting.map(|(value, place)| {
        if value.len() < 16 {
            problems.report(
                place,
                "metrics_token is shorter than 16 characters".to_string(),
            );
        }
        Secret(value)
    });

    ServerSettings {
        listen,
        public_url,
        link_secret,
        previous_link_secrets,
        otlp_endpoint,
        metrics_token,
    }
}

/// `[limits]`, with `FLOWD_REDIS_URL` over its `redis_url`.
fn limits_section(
    section: Option<toml::Spanned<LimitsSection>>,
    environment: &Environment,
    problems: &mut Problems,
) -> LimitsSection {
    let env = |name: &str| environment.get(name);
    let (mut limits, limits_span) = match section {
        Some(limits) => {
            let span = limits.span();
            (limits.into_inner(), Place::File(span))
        }
        None => (LimitsSection::default(), Place::Whole),
    };
    if let Some(url) = env("FLOWD_REDIS_URL") {
        limits.redis_url = Some(url);
    }
    if let Some(url) = &limits.redis_url {
        let place = match env("FLOWD_REDIS_URL") {
            Some(_) => Place::Env("FLOWD_REDIS_URL".into()),
            None => limits_span.clone(),
        };
        let masked = flow_runtime::mcp::masked_url(url);
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            problems.report(
                place,
                format!("[limits] redis_url `{masked}` is not a redis:// or rediss:// URL"),
            );
        } else if let Err(message) = flow_runtime::limit::redis_client(url) {
            problems.report(place, format!("[limits] redis_url `{masked}`: {message}"));
        }
    }
    if limits.retention_days == Some(0) {
        problems.report(
            limits_span.clone(),
            "[limits] retention_days 0 would delete runs as they end; leave it out to keep them"
                .to_string(),
        );
    }
    for (name, value) in [
        ("llm_concurrency", limits.llm_concurrency),
        ("steps_in_flight", limits.steps_in_flight),
        ("runs_in_flight", limits.runs_in_flight),
        ("deployments", limits.deployments),
        ("stored_bytes", limits.stored_bytes as usize),
        ("plan_bytes", limits.plan_bytes as usize),
        ("compile_seconds", limits.compile_seconds as usize),
    ] {
        if value == 0 {
            problems.report(
                limits_span.clone(),
                format!("[limits] {name} 0 would stop everything"),
            );
        }
    }
    if limits.compile_memory < LEAST_COMPILE_MEMORY {
        problems.report(
            limits_span.clone(),
            format!(
                "[limits] compile_memory {} is less than the {} MiB a compile starts in",
                limits.compile_memory,
                LEAST_COMPILE_MEMORY >> 20
            ),
        );
    }

    limits
}

/// `FLOW_LLM_CONCURRENCY`, which `flow run` reads too, over `[limits]`'s.
fn llm_concurrency_from_env(
    limits: &mut LimitsSection,
    environment: &Environment,
    problems: &mut Problems,
) {
    if let Some(text) = environment.get("FLOW_LLM_CONCURRENCY") {
        match text.parse::<usize>() {
            Ok(limit) if limit > 0 => limits.llm_concurrency = limit,
            _ => problems.report(
                Place::Env("FLOW_LLM_CONCURRENCY".into()),
                format!("`{text}` is not a number of calls above 0"),
            ),
        }
    }
}

/// `[mcp]` and its `[mcp.servers.NAME]`.
fn mcp_section(section: Option<McpFile>, problems: &mut Problems) -> McpSection {
    match section {
        Some(mcp) => {
            if !(1..=1000).contains(mcp.max_connections.get_ref()) {
                problems.at(
                    mcp.max_connections.span(),
                    format!(
                        "[mcp] max_connections is {}; it must be 1 to 1000",
                        mcp.max_connections.get_ref()
                    ),
                );
            }
            if *mcp.idle_timeout_secs.get_ref() == 0 {
                problems.at(
                    mcp.idle_timeout_secs.span(),
                    "[mcp] idle_timeout_secs 0 would close every connection at once".to_string(),
                );
            }
            let per_account = match &mcp.max_connections_per_account {
                Some(limit) => {
                    if !(1..=*mcp.max_connections.get_ref()).contains(limit.get_ref()) {
                        problems.at(
                            limit.span(),
                            format!(
                                "[mcp] max_connections_per_account is {}; it must be 1 to max_connections ({})",
                                limit.get_ref(),
                                mcp.max_connections.get_ref()
                            ),
                        );
                    }
                    *limit.get_ref()
                }
                None => default_per_account(*mcp.max_connections.get_ref()),
            };
            for (name, entry) in &mcp.servers {
                let span = entry.span();
                let entry = entry.get_ref();
                for origin in entry.allowed_origins.iter().chain(&entry.blocked_origins) {
                    if flow_runtime::egress::AllowedHost::of_origin(origin).is_none() {
                        problems.at(
                            span.clone(),
                            format!("[mcp.servers.{name}] `{origin}` is not an origin; write `scheme://host`, `scheme://host:port` or `scheme://host:*`"),
                        );
                    }
                }
                let browser_only = !entry.allowed_origins.is_empty()
                    || !entry.blocked_origins.is_empty()
                    || entry.allow_private_network;
                if browser_only && !entry.is_browser() {
                    problems.at(
                        span.clone(),
                        format!("[mcp.servers.{name}] allowed_origins, blocked_origins and allow_private_network are for a browser server (Playwright's: `browser = true`)"),
                    );
                }
                if entry.is_browser() && entry.url.is_some() {
                    problems.at(
                        span.clone(),
                        format!("[mcp.servers.{name}] a browser server reached by `url` runs outside flowd, which cannot put its browser behind the network policy; start it with `command`, or set `browser = false` and secure that server yourself"),
                    );
                }
                if entry.is_browser() {
                    for (setting, undoes) in entry.undoing_browser_policy() {
                        problems.at(
                            span.clone(),
                            format!("[mcp.servers.{name}] a browser server may not set {setting}: it would {undoes}"),
                        );
                    }
                    if let Some(file) = entry.playwright_config() {
                        for problem in browser_config_file(file) {
                            problems.at(span.clone(), format!("[mcp.servers.{name}] {problem}"));
                        }
                    }
                }
                match (&entry.command, &entry.url) {
                    (Some(_), Some(_)) | (None, None) => problems.at(
                        span.clone(),
                        format!("[mcp.servers.{name}] needs either `command` (a server flowd starts) or `url` (one it connects to), not both or neither"),
                    ),
                    (Some(command), None) if command.trim().is_empty() => problems.at(
                        span.clone(),
                        format!("[mcp.servers.{name}] command is empty"),
                    ),
                    (None, Some(Secret(url))) => {
                        if let Err(message) = check_http_url(url) {
                            problems.at(span.clone(), format!("[mcp.servers.{name}] url {message}"));
                        }
                        if !entry.args.is_empty() || !entry.env.is_empty() {
                            problems.at(
                                span.clone(),
                                format!("[mcp.servers.{name}] args and env are for a `command`, not a `url`"),
                            );
                        }
                    }
                    _ => {}
                }
            }
            McpSection {
                max_connections: mcp.max_connections.into_inner(),
                max_connections_per_account: per_account,
                idle_timeout_secs: mcp.idle_timeout_secs.into_inner(),
                pass_env: mcp.pass_env,
                servers: mcp
                    .servers
                    .into_iter()
                    .map(|(name, entry)| (name, entry.into_inner()))
                    .collect(),
            }
        }
        None => McpSection::default(),
    }
}

/// `[smtp]`, with `FLOWD_SMTP_HOST` and `FLOWD_SMTP_PORT` over it.
/// What is wrong with a browser server's Playwright configuration file
/// at `path`: read as flowd starts the server, in an empty directory of
/// its own, so it is named by its absolute path; and none of its settings
/// may undo the browser policy (`McpServerEntry::undoing_in_config_file`).
fn browser_config_file(path: &str) -> Vec<String> {
    if !std::path::Path::new(path).is_absolute() {
        return vec![format!(
            "its Playwright configuration file `{path}` is named by a relative path: the server starts in an empty directory of its own; name it from `/`"
        )];
    }
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => {
            return vec![format!(
                "its Playwright configuration file {path} cannot be read ({error}): flowd checks that it keeps the browser policy"
            )];
        }
    };
    match McpServerEntry::undoing_in_config_file(&text) {
        Err(error) => vec![format!("its Playwright configuration file {path} {error}")],
        Ok(settings) => settings
            .into_iter()
            .map(|(setting, undoes)| {
                format!("a browser server's configuration file {path} may not set {setting}: it would {undoes}")
            })
            .collect(),
    }
}

fn smtp_section(
    section: Option<Smtp>,
    environment: &Environment,
    problems: &mut Problems,
) -> Option<Smtp> {
    let env = |name: &str| environment.get(name);
    let mut smtp = section;
    if let Some(host) = env("FLOWD_SMTP_HOST") {
        let port = smtp.as_ref().map_or(default_smtp_port(), |s| s.port);
        let from = smtp.as_ref().map(|s| s.from.clone()).unwrap_or_default();
        smtp = Some(Smtp {
            host,
            port,
            from,
            username: smtp.as_ref().and_then(|s| s.username.clone()),
            password: smtp.as_ref().and_then(|s| s.password.clone()),
            tls: smtp.as_ref().map(|s| s.tls).unwrap_or_default(),
        });
    }
    if let Some(port) = env("FLOWD_SMTP_PORT") {
        match (port.parse::<u16>(), smtp.as_mut()) {
            (Ok(port), Some(smtp)) => smtp.port = port,
            (Ok(_), None) => problems.report(
                Place::Env("FLOWD_SMTP_PORT".into()),
                "a port without an SMTP host (set [smtp] host or FLOWD_SMTP_HOST)".into(),
            ),
            (Err(_), _) => problems.report(
                Place::Env("FLOWD_SMTP_PORT".into()),
                format!("`{port}` is not a port number"),
            ),
        }
    }
    if let Some(smtp) = &smtp
        && !smtp.from.contains('@')
    {
        problems.report(
            Place::Whole,
            format!(
                "[smtp] from `{}` is not an email address: emails need a sender",
                smtp.from
            ),
        );
    }

    // The transport serve builds, built here too: a host that TLS cannot
    // name is refused by the check rather than at the first email.
    if let Some(Err(message)) = smtp.as_ref().map(crate::mailer::transport) {
        problems.report(Place::Whole, message);
    }

    smtp
}

/// One `[[accounts]]` entry; `earlier` are the entries before it, and
/// `key_owner` who holds each API key seen so far.
fn account_section(
    account: toml::Spanned<AccountFile>,
    earlier: &[Account],
    key_owner: &mut HashMap<String, String>,
    mcp: &McpSection,
    problems: &mut Problems,
) -> Account {
    let span = account.span();
    let account = account.into_inner();
    if account.id.is_empty() || earlier.iter().any(|a| a.id == account.id) {
        problems.at(
            span.clone(),
            format!("account id `{}` is empty or used twice", account.id),
        );
    }
    account_keys(&account, span.clone(), key_owner, problems);
    let mut people = |table: &str, entries: BTreeMap<String, toml::Spanned<Vec<String>>>| {
        entries
            .into_iter()
            .map(|(name, members)| {
                let span = members.span();
                let members = members.into_inner();
                if members.is_empty() {
                    problems.at(
                        span.clone(),
                        format!("account `{}`: {table} `{name}` has no members", account.id),
                    );
                }
                for member in members.iter().filter(|m| !is_email(m)) {
                    problems.at(
                        span.clone(),
                        format!(
                            "account `{}`: {table} `{name}`: `{member}` is not an email address",
                            account.id
                        ),
                    );
                }
                (name, members)
            })
            .collect::<BTreeMap<_, _>>()
    };
    let departments = people("departments", account.departments);
    let approver_groups = people("approver_groups", account.approver_groups);
    let mut positive = |name: &str, value: Option<toml::Spanned<usize>>| {
        value.map(|limit| {
            if *limit.get_ref() == 0 {
                problems.at(
                    limit.span(),
                    format!("account `{}`: {name} 0 would stop everything", account.id),
                );
            }
            limit.into_inner()
        })
    };
    let llm_concurrency = positive("llm_concurrency", account.llm_concurrency);
    let steps_in_flight = positive("steps_in_flight", account.steps_in_flight);
    let runs_in_flight = positive("runs_in_flight", account.runs_in_flight);
    let deployments = positive("deployments", account.deployments);
    let stored_bytes = account.stored_bytes.map(|limit| {
        if *limit.get_ref() == 0 {
            problems.at(
                limit.span(),
                format!(
                    "account `{}`: stored_bytes 0 would stop everything",
                    account.id
                ),
            );
        }
        limit.into_inner()
    });
    let mcp_servers = account_mcp_servers(&account.id, account.mcp_servers, &span, mcp, problems);
    account_webhooks(&account.id, &account.webhooks, problems);
    let webhooks = account
        .webhooks
        .into_iter()
        .map(toml::Spanned::into_inner)
        .collect();
    Account {
        id: account.id,
        api_keys: account.api_keys,
        users: account
            .users
            .into_iter()
            .map(toml::Spanned::into_inner)
            .collect(),
        departments,
        approver_groups,
        mail_domains: account.mail_domains,
        llm_concurrency,
        mcp_servers,
        steps_in_flight,
        runs_in_flight,
        deployments,
        stored_bytes,
        webhooks,
    }
}

/// An account's API keys and those of its users: at least one, each long
/// enough and held by one holder only (`key_owner`: who holds each key
/// seen so far, across accounts).
fn account_keys(
    account: &AccountFile,
    span: Span,
    key_owner: &mut HashMap<String, String>,
    problems: &mut Problems,
) {
    if account.api_keys.is_empty()
        && account
            .users
            .iter()
            .all(|u| u.get_ref().api_keys.is_empty())
    {
        problems.at(
            span.clone(),
            format!(
                "account `{}` has no api_keys, nor users with keys: nobody could use it",
                account.id
            ),
        );
    }
    let mut emails: Vec<String> = Vec::new();
    for user in &account.users {
        let email = &user.get_ref().email;
        if !is_email(email) {
            problems.at(
                user.span(),
                format!(
                    "account `{}`: user `{email}` is not an email address",
                    account.id
                ),
            );
        }
        if emails.iter().any(|e| e.eq_ignore_ascii_case(email)) {
            problems.at(
                user.span(),
                format!("account `{}`: user `{email}` is listed twice", account.id),
            );
        }
        emails.push(email.clone());
        if user.get_ref().api_keys.is_empty() {
            problems.at(
                user.span(),
                format!("account `{}`: user `{email}` has no api_keys", account.id),
            );
        }
    }
    let keys = account
        .api_keys
        .iter()
        .map(|key| (span.clone(), key, None))
        .chain(account.users.iter().flat_map(|user| {
            let email = &user.get_ref().email;
            user.get_ref()
                .api_keys
                .iter()
                .map(move |key| (user.span(), key, Some(email)))
        }));
    for (span, Secret(key), user) in keys {
        let holder = match user {
            Some(email) => format!("user `{email}` of account `{}`", account.id),
            None => format!("account `{}`", account.id),
        };
        if key.len() < 16 {
            problems.at(
                span.clone(),
                format!("an API key of {holder} is shorter than 16 characters"),
            );
        }
        if let Some(owner) = key_owner.insert(key.clone(), holder.clone()) {
            problems.at(
                span,
                format!(
                    "an API key of {holder} is also a key of {owner}: a key belongs to one holder"
                ),
            );
        }
    }
}

/// An account's webhook endpoints: named once each, reachable, signed with
/// a key long enough, for known events.
fn account_webhooks(id: &str, webhooks: &[toml::Spanned<Webhook>], problems: &mut Problems) {
    let mut names: Vec<&str> = Vec::new();
    for webhook in webhooks {
        let span = webhook.span();
        let hook = webhook.get_ref();
        if hook.name.is_empty() || names.contains(&hook.name.as_str()) {
            problems.at(
                span.clone(),
                format!(
                    "account `{}`: webhook name `{}` is empty or used twice",
                    id, hook.name
                ),
            );
        }
        names.push(&hook.name);
        if let Err(message) = check_http_url(&hook.url) {
            problems.at(span.clone(), format!("webhook url {message}"));
        }
        if crate::webhooks::key(&hook.secret.0).len() < 16 {
            problems.at(
                span.clone(),
                "a webhook secret is shorter than 16 characters (or 16 bytes, for a `whsec_` one)"
                    .to_string(),
            );
        }
        for event in hook.events.iter().filter(|e| !EVENTS.contains(&e.as_str())) {
            problems.at(
                span.clone(),
                format!(
                    "webhook event `{event}` is not one of `completed`, `failed`, `parked`, `cancelled`"
                ),
            );
        }
    }
}

/// The `[mcp.servers.NAME]` an account may use, each one configured.
fn account_mcp_servers(
    id: &str,
    servers: Option<toml::Spanned<Vec<String>>>,
    span: &Span,
    mcp: &McpSection,
    problems: &mut Problems,
) -> Vec<String> {
    let (mcp_span, mcp_servers) = match servers {
        Some(servers) => (servers.span(), servers.into_inner()),
        None => (span.clone(), Vec::new()),
    };
    for name in mcp_servers.iter().filter(|n| !mcp.servers.contains_key(*n)) {
        let known: Vec<&str> = mcp.servers.keys().map(String::as_str).collect();
        problems.at(
            mcp_span.clone(),
            format!(
                "account `{}`: mcp_servers names `{name}`, which no [mcp.servers.{name}] configures ({})",
                id,
                if known.is_empty() {
                    "none is configured".to_string()
                } else {
                    format!("configured: {}", known.join(", "))
                }
            ),
        );
    }
    mcp_servers
}

/// `store`, or `FLOWD_STORE` over it.
fn store_location(
    store: &Option<toml::Spanned<String>>,
    environment: &Environment,
    problems: &mut Problems,
) -> StoreLocation {
    match setting(environment, "FLOWD_STORE", store) {
        None => StoreLocation(DEFAULT_STORE.to_string()),
        Some((location, place)) => {
            let store = StoreLocation(location);
            if let Err(message) = store.check() {
                problems.report(place, message);
            }
            store
        }
    }
}

/// The `[provider]` section with the `FLOW_LLM_*` variables that `flow run`
/// reads applied over it, so that one environment configures both:
/// `FLOW_LLM_PROVIDER` and `FLOW_LLM_BASE_URL` (either one configures a
/// provider the file lacks), `FLOW_LLM_API_KEY` (else `OPENAI_API_KEY` or
/// `ANTHROPIC_API_KEY`, by kind, when the file gives no key),
/// `FLOW_LLM_MODEL` (the alias `default`) and `FLOW_LLM_MODEL_ALIAS`.
fn provider_with_env(
    file: Option<toml::Spanned<Provider>>,
    environment: &Environment,
    problems: &mut Problems,
) -> Option<Provider> {
    let env = |name: &str| environment.get(name);
    let kind = env("FLOW_LLM_PROVIDER");
    let base_url = env("FLOW_LLM_BASE_URL");
    let (mut place, mut provider) = match file {
        Some(provider) => (Place::File(provider.span()), provider.into_inner()),
        None if kind.is_some() || base_url.is_some() => (
            Place::Env("FLOW_LLM_PROVIDER".into()),
            Provider {
                kind: "openai".to_string(),
                base_url: String::new(),
                api_key: None,
                models: HashMap::new(),
            },
        ),
        None => return None,
    };
    let section = place.clone();
    if let Some(kind) = kind {
        provider.kind = kind;
        place = Place::Env("FLOW_LLM_PROVIDER".into());
    }
    if !matches!(provider.kind.as_str(), "openai" | "anthropic") {
        problems.report(
            place.clone(),
            format!(
                "[provider] kind is `{}`; the providers are `openai` and `anthropic`",
                provider.kind
            ),
        );
    }
    let mut url_place = place;
    if let Some(url) = base_url {
        provider.base_url = url;
        url_place = Place::Env("FLOW_LLM_BASE_URL".into());
    } else if provider.base_url.is_empty() && provider.kind == "anthropic" {
        provider.base_url = "https://api.anthropic.com".to_string();
    }
    if provider.base_url.is_empty() {
        problems.report(
            url_place,
            "no base URL for the provider: set FLOW_LLM_BASE_URL (an OpenAI-compatible API's, up to `/v1`)".to_string(),
        );
    } else if let Err(message) = check_http_url(&provider.base_url) {
        problems.report(url_place, format!("[provider] base_url {message}"));
    }
    let vendor_key = match provider.kind.as_str() {
        "anthropic" => "ANTHROPIC_API_KEY",
        _ => "OPENAI_API_KEY",
    };
    let mut key_place = section;
    // An empty variable is no key, and hides no other (as `flow`'s).
    let key_in = |name: &str| env(name).filter(|key| !key.is_empty());
    if let Some((name, key)) = key_in("FLOW_LLM_API_KEY")
        .map(|key| ("FLOW_LLM_API_KEY", key))
        .or_else(|| {
            key_in(vendor_key)
                .filter(|_| provider.api_key.is_none())
                .map(|key| (vendor_key, key))
        })
    {
        provider.api_key = Some(Secret(key));
        key_place = Place::Env(name.into());
    }
    if let Some(Secret(key)) = &provider.api_key
        && let Err(message) = check_api_key(key)
    {
        problems.report(key_place, format!("[provider] api_key {message}"));
    }
    for (name, model) in environment.with_prefix("FLOW_LLM_MODEL") {
        let alias = match name.strip_prefix("FLOW_LLM_MODEL") {
            Some("") => "default".to_string(),
            Some(rest) => match rest.strip_prefix('_') {
                Some(alias) if !alias.is_empty() => alias.to_ascii_lowercase(),
                _ => continue,
            },
            None => continue,
        };
        provider.models.insert(alias, model);
    }
    Some(provider)
}
