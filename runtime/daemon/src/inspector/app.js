// flowd's run inspector: the account's runs, and one run with its step tree
// and its pending approvals, read from the /v1 API with the key entered at
// the top. Every value that comes from the API is put into the page as text
// (text nodes and attributes), never parsed as markup: a run's data is
// written by whoever started it, and by the language models it called.

const KEY_STORAGE = 'flowd.inspector.api-key';
const APPROVER_STORAGE = 'flowd.inspector.approver';
const RUN_STATUSES = ['running', 'pending_approval', 'completed', 'failed', 'cancelled'];
const STEP_STATUSES = ['completed', 'failed', 'pending'];

const view = document.getElementById('view');
const identityForm = document.getElementById('identity');
const keyInput = document.getElementById('api-key');
const approverInput = document.getElementById('approver');

// Each navigation bumps this; work begun for an older one drops its result,
// so a slow answer never paints over the page the user has moved on to.
let navigation = 0;
// The step details the user has opened, by run and path, kept across the
// re-renders that polling causes.
const openSteps = new Set();

// ---- DOM and formatting helpers ------------------------------------------

/** An element with attributes (`testid` sets data-testid, `on…` listens) and children. */
function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'testid') element.dataset.testid = value;
    else if (name.startsWith('on')) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

function show(...nodes) {
  view.replaceChildren(...nodes);
}

function statusBadge(status, testid) {
  const known = RUN_STATUSES.includes(status) || STEP_STATUSES.includes(status);
  return h('span', { class: `badge status-${known ? status : 'other'}`, testid }, status);
}

function json(value) {
  return h('pre', { class: 'json' }, JSON.stringify(value, null, 2));
}

const pad = (number, width = 2) => String(number).padStart(width, '0');

/** A date and time in the viewer's zone, to the second or the millisecond. */
function dateTime(ms, withMillis = false) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(ms, withMillis)}`;
}

/** A time of day, with milliseconds for step timings. */
function clock(ms, withMillis = true) {
  const d = new Date(ms);
  const seconds = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return withMillis ? `${seconds}.${pad(d.getMilliseconds(), 3)}` : seconds;
}

function duration(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const minutes = Math.floor(ms / 60_000);
  if (minutes < 60) return `${minutes} min ${Math.round((ms % 60_000) / 1000)} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

const runHref = (id) => `#/runs/${encodeURIComponent(id)}`;

// ---- The API -------------------------------------------------------------

/** A refused request: the problem's `detail` is the message. */
class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail ?? `flowd answered HTTP ${status}`);
    this.status = status;
    this.code = problem?.code;
  }
}

async function api(path, { method = 'GET', body } = {}) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY_STORAGE) ?? ''}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    // An answer that is not JSON (a proxy's error page) keeps data null.
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

const runPath = (id) => `/v1/runs/${encodeURIComponent(id)}`;

/** The approval route of a gate; its path keeps `/` between (encoded) segments. */
const approvalPath = (id, stepPath) =>
  `${runPath(id)}/approvals/${stepPath.split('/').map(encodeURIComponent).join('/')}`;

// ---- Identity: the API key (this tab only) and the approver (remembered) --

keyInput.value = sessionStorage.getItem(KEY_STORAGE) ?? '';
approverInput.value = localStorage.getItem(APPROVER_STORAGE) ?? '';

identityForm.addEventListener('submit', (event) => {
  event.preventDefault();
  const key = keyInput.value.trim();
  const approver = approverInput.value.trim();
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
  if (approver) localStorage.setItem(APPROVER_STORAGE, approver);
  else localStorage.removeItem(APPROVER_STORAGE);
  render();
});

// ---- Navigation ----------------------------------------------------------

window.addEventListener('hashchange', render);
render();

async function render() {
  const current = ++navigation;
  const [path, query = ''] = (location.hash.replace(/^#/, '') || '/').split('?');
  if (!sessionStorage.getItem(KEY_STORAGE)) {
    show(h('p', { class: 'notice', testid: 'need-key' }, 'Enter an API key above to see its account’s runs.'));
    keyInput.focus();
    return;
  }
  const run = /^\/runs\/([^/]+)$/.exec(path);
  try {
    if (run) await showRun(decodeURIComponent(run[1]), current);
    else await showRuns(new URLSearchParams(query), current);
  } catch (error) {
    if (current !== navigation) return;
    show(
      h('p', { class: 'notice error', role: 'alert', testid: 'load-error' }, error.message),
      run ? h('p', {}, h('a', { href: '#/' }, '← All runs')) : null,
    );
    if (error.status === 401) keyInput.focus();
  }
}

// ---- The runs list -------------------------------------------------------

async function showRuns(params, current) {
  const status = params.get('status') ?? '';
  const workflow = params.get('workflow') ?? '';
  const query = new URLSearchParams({ limit: '100' });
  if (status) query.set('status', status);
  if (workflow) query.set('workflow', workflow);
  const [{ runs }, { deployments }] = await Promise.all([
    api(`/v1/runs?${query}`),
    api('/v1/workflows'),
  ]);
  if (current !== navigation) return;

  const workflows = [...new Set(deployments.map((d) => d.workflow))].sort();
  if (workflow && !workflows.includes(workflow)) workflows.push(workflow);
  const filters = h(
    'form',
    { class: 'filters', testid: 'run-filters' },
    h('label', {}, 'Status ',
      h('select', { name: 'status', testid: 'status-filter' },
        h('option', { value: '' }, 'any'),
        RUN_STATUSES.map((s) => h('option', { value: s, selected: s === status }, s)))),
    h('label', {}, 'Workflow ',
      h('select', { name: 'workflow', testid: 'workflow-filter' },
        h('option', { value: '' }, 'any'),
        workflows.map((w) => h('option', { value: w, selected: w === workflow }, w)))),
    h('button', { type: 'button', onclick: render }, 'Refresh'),
  );
  // Filters live in the address, so that a filtered list can be linked to.
  filters.addEventListener('change', () => {
    const chosen = new URLSearchParams();
    for (const [name, value] of new FormData(filters)) if (value) chosen.set(name, value);
    location.hash = chosen.size ? `#/?${chosen}` : '#/';
  });

  const rows = runs.map((run) =>
    h('tr', { testid: 'run-row', 'data-run-id': run.run_id },
      h('td', {}, h('a', { href: runHref(run.run_id), class: 'mono' }, run.run_id)),
      h('td', {}, run.workflow),
      h('td', {}, statusBadge(run.status, 'run-row-status')),
      h('td', { class: 'time' }, dateTime(run.created_ms)),
      h('td', { class: 'time' }, dateTime(run.updated_ms))));
  show(
    h('h2', {}, 'Runs'),
    filters,
    rows.length
      ? h('table', { class: 'runs', testid: 'runs' },
        h('thead', {}, h('tr', {}, ['Run', 'Workflow', 'Status', 'Created', 'Updated'].map((c) => h('th', {}, c)))),
        h('tbody', {}, rows))
      : h('p', { class: 'muted', testid: 'no-runs' }, 'No runs match.'),
    h('p', { class: 'muted' }, `${rows.length} run(s), newest first${rows.length === 100 ? ' (the latest 100)' : ''}.`),
  );
}

// ---- One run -------------------------------------------------------------

async function fetchRun(id) {
  const [run, trace] = await Promise.all([api(runPath(id)), api(`${runPath(id)}/trace`)]);
  return { run, steps: trace.steps };
}

/** What a re-render would change: the record and the trace. */
const fingerprint = ({ run, steps }) => JSON.stringify([run, steps]);

async function showRun(id, current) {
  const loaded = await fetchRun(id);
  if (current !== navigation) return;
  paintRun(loaded, current);
  if (loaded.run.status === 'running') watch(id, current, fingerprint(loaded));
}

/**
 * Polls the run until it differs from `seen`, then paints it; keeps going
 * while it is running. The wait grows from 250 ms to 2 s while nothing
 * changes, so a decision shows quickly and a long run costs little.
 */
async function watch(id, current, seen) {
  let wait = 250;
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, wait));
    if (current !== navigation) return;
    let loaded;
    try {
      loaded = await fetchRun(id);
    } catch {
      // A failed poll is retried: flowd may be restarting.
      wait = Math.min(wait * 2, 2000);
      continue;
    }
    if (current !== navigation) return;
    const now = fingerprint(loaded);
    if (now === seen) {
      wait = Math.min(wait * 2, 2000);
      continue;
    }
    paintRun(loaded, current);
    if (loaded.run.status !== 'running') return;
    seen = now;
    wait = 250;
  }
}

function paintRun(loaded, current) {
  const { run, steps } = loaded;
  show(
    h('p', {}, h('a', { href: '#/', testid: 'back' }, '← All runs')),
    h('h2', {}, 'Run ', h('span', { class: 'mono', testid: 'run-id' }, run.run_id), ' ', statusBadge(run.status, 'run-status')),
    h('dl', { class: 'facts' },
      h('dt', {}, 'Workflow'), h('dd', { testid: 'run-workflow' }, run.workflow),
      h('dt', {}, 'Created'), h('dd', {}, dateTime(run.created_ms)),
      h('dt', {}, 'Steps'), h('dd', {}, `${steps.length} recorded`)),
    outcomeSection(loaded, current),
    h('h3', {}, 'Steps'),
    steps.length
      ? h('ul', { class: 'tree', testid: 'step-tree' }, stepTree(steps).map((node) => treeItem(node, run)))
      : h('p', { class: 'muted' }, 'No step has run yet.'),
  );
}

function outcomeSection(loaded, current) {
  const { run } = loaded;
  switch (run.status) {
    case 'completed':
      return h('section', { class: 'outcome' }, h('h3', {}, 'Output'), h('div', { testid: 'run-output' }, json(run.output)));
    case 'failed':
      return h('section', { class: 'outcome failed', testid: 'run-error' },
        h('h3', {}, 'Error'),
        h('p', {}, h('span', { class: 'kind' }, run.error?.kind ?? 'error'), ' ', run.error?.message ?? ''),
        run.error?.step ? h('p', { class: 'muted' }, 'at step ', h('span', { class: 'mono' }, run.error.step)) : null);
    case 'pending_approval':
      return h('section', { class: 'outcome' },
        h('h3', {}, 'Waiting for approval'),
        (run.pending_approvals ?? []).map((gate) => gateCard(gate, loaded, current)));
    case 'running':
      return h('p', { class: 'notice' }, 'Running. This page follows it as it goes.');
    default:
      return h('p', { class: 'notice' }, `The run is ${run.status}.`);
  }
}

/** A pending approval: what it asks, who may answer, and the answer buttons. */
function gateCard(gate, loaded, current) {
  const approver = localStorage.getItem(APPROVER_STORAGE);
  const comment = h('textarea', { rows: 2, testid: 'comment', placeholder: 'Comment (optional)' });
  const message = h('p', { class: 'gate-status', role: 'status', testid: 'gate-status' });
  const approve = h('button', { type: 'button', class: 'approve', testid: 'approve' }, 'Approve');
  const reject = h('button', { type: 'button', class: 'reject', testid: 'reject' }, 'Reject');

  async function decide(approved) {
    const as = localStorage.getItem(APPROVER_STORAGE);
    message.classList.remove('error');
    if (!as) {
      message.classList.add('error');
      message.textContent = 'Enter your email under “You are” above, then decide.';
      approverInput.focus();
      return;
    }
    approve.disabled = reject.disabled = true;
    message.textContent = 'Sending…';
    const text = comment.value.trim();
    try {
      await api(approvalPath(loaded.run.run_id, gate.path), {
        method: 'POST',
        body: { approver: as, approved, comment: text || undefined },
      });
    } catch (error) {
      message.classList.add('error');
      message.textContent = error.message;
      approve.disabled = reject.disabled = false;
      return;
    }
    message.textContent = `${approved ? 'Approved' : 'Rejected'} as ${as}. Waiting for the run to go on…`;
    watch(loaded.run.run_id, current, fingerprint(loaded));
  }
  approve.addEventListener('click', () => decide(true));
  reject.addEventListener('click', () => decide(false));

  return h('article', { class: 'gate', testid: 'gate', 'data-path': gate.path },
    h('header', {}, h('span', { class: 'mono' }, gate.path), expiry(gate, loaded.steps)),
    h('blockquote', { testid: 'gate-message' }, gate.message),
    h('p', { testid: 'gate-approvers' }, 'Approvers: ',
      gate.approvers.map((approverEntry, i) => [i ? ', ' : '', h('span', { class: 'mono' }, approverEntry)])),
    comment,
    h('div', { class: 'actions' }, approve, reject,
      h('span', { class: 'muted' }, approver ? `as ${approver}` : 'enter your email under “You are” first')),
    message);
}

/**
 * When a gate expires. Its `expires_ms` is how long it may wait, counted
 * from when it was reached, which only its trace record tells.
 */
function expiry(gate, steps) {
  const reached = steps.find((record) => record.path === gate.path)?.started_ms;
  if (!gate.expires_ms || reached === undefined) return null;
  return h('span', { class: 'muted', testid: 'gate-expiry' }, ` · expires ${dateTime(reached + gate.expires_ms)}`);
}

// ---- The step tree -------------------------------------------------------

/**
 * The trace's records as a tree. A record's path says where it ran: the
 * interpreter prefixes a loop iteration's steps with `id[i]/`, a parallel
 * branch's with `id/branch/`, a step's fallback with `step/fallback/` and
 * the workflow's error handler with `on_error/`. Loops and parallels have no
 * record of their own, so they appear here as group nodes; a segment before
 * `fallback` that has a record is a step, and one without is a parallel.
 */
function stepTree(records) {
  const byPath = new Map(records.map((record) => [record.path, record]));
  const root = { children: [] };
  const nodes = new Map();
  const child = (parent, path, fields) => {
    let node = nodes.get(path);
    if (!node) {
      node = { path, children: [], ...fields };
      nodes.set(path, node);
      parent.children.push(node);
    }
    return node;
  };
  for (const record of records) {
    const segments = record.path.split('/');
    let parent = root;
    let prefix = '';
    const under = (segment) => (prefix ? `${prefix}/${segment}` : segment);
    for (let i = 0; i < segments.length - 1;) {
      const segment = segments[i];
      const iteration = /^(.*)\[(\d+)\]$/.exec(segment);
      if (iteration) {
        const loop = child(parent, under(iteration[1]), { label: iteration[1], kind: 'loop' });
        prefix = under(segment);
        parent = child(loop, prefix, { label: `[${iteration[2]}]`, kind: 'iteration', index: Number(iteration[2]) });
        i += 1;
      } else if (i === 0 && segment === 'on_error') {
        prefix = segment;
        parent = child(root, prefix, { label: 'on_error', kind: 'workflow error handler' });
        i += 1;
      } else {
        const stepHere = byPath.get(under(segment));
        const container = child(parent, under(segment), stepHere
          ? { label: segment, record: stepHere }
          : { label: segment, kind: 'parallel' });
        prefix = `${container.path}/${segments[i + 1]}`;
        parent = child(container, prefix, { label: segments[i + 1], kind: stepHere ? 'fallback' : 'branch' });
        i += 2;
      }
    }
    child(parent, record.path, { label: segments.at(-1) }).record = record;
  }
  // Iterations run concurrently, so the journal may hold them out of order.
  for (const node of nodes.values()) {
    if (node.kind === 'loop') node.children.sort((a, b) => a.index - b.index);
  }
  return root.children;
}

/** The records under a node, its own included. */
function recordsOf(node) {
  return [node.record, ...node.children.flatMap(recordsOf)].filter(Boolean);
}

function treeItem(node, run) {
  const children = node.children.length
    ? h('ul', {}, node.children.map((childNode) => treeItem(childNode, run)))
    : null;
  return node.record ? stepItem(node, run, children) : groupItem(node, run, children);
}

function stepItem(node, run, children) {
  const record = node.record;
  const elapsed = record.ended_ms - record.started_ms;
  const timing = record.status === 'pending'
    ? `since ${clock(record.started_ms)} (${duration(Date.now() - record.started_ms)})`
    : `${clock(record.started_ms)} · ${duration(elapsed)}`;
  const failedAttempts = record.attempts.filter((attempt) => attempt.error).length;
  const openKey = `${run.run_id} ${record.path}`;
  const details = h('details', { open: openSteps.has(openKey) || record.status === 'failed' },
    h('summary', {},
      h('span', { class: 'name' }, node.label),
      h('span', { class: 'kind' }, record.kind),
      statusBadge(record.status, 'step-status'),
      h('span', { class: 'timing', testid: 'step-timing' }, timing),
      record.attempts.length > 1 || failedAttempts
        ? h('span', { class: 'attempt-count' }, `${record.attempts.length} attempts`)
        : null),
    h('div', { class: 'step-body' },
      h('p', { class: 'muted mono' }, record.path),
      h('h4', {}, 'Input'), json(record.input),
      record.output !== null && record.output !== undefined ? [h('h4', {}, 'Output'), json(record.output)] : null,
      record.error
        ? [h('h4', {}, 'Error'), h('p', { class: 'error', testid: 'step-error' },
          h('span', { class: 'kind' }, record.error.kind), ' ', record.error.message)]
        : null,
      attemptsTable(record.attempts),
      h('p', { class: 'muted' },
        `Started ${dateTime(record.started_ms, true)}, ${duration(Math.max(0, record.started_ms - run.created_ms))} after the run was created.`)));
  details.addEventListener('toggle', () => {
    if (details.open) openSteps.add(openKey);
    else openSteps.delete(openKey);
  });
  return h('li', {
    class: 'node step', testid: 'step', 'data-path': record.path, 'data-status': record.status, 'data-kind': record.kind,
  }, details, children);
}

function attemptsTable(attempts) {
  if (attempts.length <= 1 && !attempts.some((attempt) => attempt.error)) return null;
  return [
    h('h4', {}, 'Attempts'),
    h('table', { class: 'attempts', testid: 'attempts' },
      h('thead', {}, h('tr', {}, h('th', {}, '#'), h('th', {}, 'Error'), h('th', {}, 'Wait before the next'))),
      h('tbody', {}, attempts.map((attempt) => h('tr', {},
        h('td', {}, attempt.index),
        h('td', { class: attempt.error ? 'error' : 'muted' }, attempt.error ?? 'succeeded'),
        h('td', {}, attempt.delay_ms === null || attempt.delay_ms === undefined ? '' : duration(attempt.delay_ms)))))),
  ];
}

/** A loop, an iteration, a parallel, a branch or a handler: what ran inside it. */
function groupItem(node, run, children) {
  const records = recordsOf(node);
  const counts = STEP_STATUSES
    .map((status) => [status, records.filter((record) => record.status === status).length])
    .filter(([, count]) => count > 0);
  const started = Math.min(...records.map((record) => record.started_ms));
  const ended = Math.max(...records.map((record) => record.ended_ms));
  return h('li', { class: 'node group', testid: 'group', 'data-path': node.path, 'data-kind': node.kind },
    h('div', { class: 'group-summary' },
      h('span', { class: 'name' }, node.label),
      h('span', { class: 'kind' }, node.kind),
      counts.map(([status, count]) => h('span', { class: `badge status-${status}` }, `${count} ${status}`)),
      h('span', { class: 'timing' }, `${clock(started)} · ${duration(ended - started)}`)),
    children);
}
