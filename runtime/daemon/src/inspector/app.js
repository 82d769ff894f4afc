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
  const cursor = params.get('cursor') ?? '';
  const query = new URLSearchParams({ limit: '100' });
  if (status) query.set('status', status);
  if (workflow) query.set('workflow', workflow);
  if (cursor) query.set('cursor', cursor);
  const [{ runs, next }, { deployments }] = await Promise.all([
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
    h('p', { class: 'muted' },
      `${rows.length} run(s), newest first${cursor ? ', older than the page before' : ''}. `,
      next ? h('a', { href: `#/?${olderPage(status, workflow, next)}`, testid: 'older-runs' }, 'Older runs →') : null),
  );
}

/** The address of the page after this one, with the same filters. */
function olderPage(status, workflow, next) {
  const page = new URLSearchParams();
  if (status) page.set('status', status);
  if (workflow) page.set('workflow', workflow);
  page.set('cursor', next);
  return page;
}

// ---- One run -------------------------------------------------------------

async function fetchRun(id) {
  const [run, trace, graph] = await Promise.all([
    api(runPath(id)),
    api(`${runPath(id)}/trace`),
    api(`${runPath(id)}/graph`),
  ]);
  return { run, steps: trace.steps, inFlight: trace.in_flight ?? [], graph };
}

/** What a re-render would change: the record and the trace (the graph follows from them). */
const fingerprint = ({ run, steps, inFlight }) => JSON.stringify([run, steps, inFlight]);

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
    h('h3', {}, 'Timeline'),
    steps.length
      ? timeline(steps, run)
      : h('p', { class: 'muted' }, 'No step has run yet.'),
    h('h3', {}, 'Graph'),
    graphView(loaded.graph),
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
      return h('p', { class: 'notice' }, 'Running. This page follows it as it goes.',
        loaded.inFlight.length
          ? h('span', { testid: 'in-flight' }, ' Now: ',
            loaded.inFlight.map((step, i) => [
              i ? ', ' : '',
              h('span', { class: 'mono' }, step.path),
              ` (${step.kind}${step.calling_since_ms == null ? ', waiting to retry' : step.attempts_failed ? `, attempt ${step.attempts_failed + 1}` : ''})`,
            ]), '.')
          : null);
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

// ---- Pictures: SVG built from DOM nodes, text as text nodes ---------------

const SVG_NS = 'http://www.w3.org/2000/svg';

/** An SVG element, as `h` makes HTML ones; `title` adds a hover text. */
function svg(tag, attributes = {}, ...children) {
  const element = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false || name === 'title') continue;
    if (name === 'testid') element.setAttribute('data-testid', value);
    else element.setAttribute(name, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  if (attributes.title) element.append(svg('title', {}, attributes.title));
  return element;
}

const round = (number) => Math.round(number * 10) / 10;

// ---- The timeline --------------------------------------------------------

const LABEL_WIDTH = 240;
const BARS_WIDTH = 760;
const ROW_HEIGHT = 22;
const AXIS_HEIGHT = 26;

/**
 * Each step a bar on one time axis, in the step tree's order (loops,
 * iterations, parallels and branches as bracket rows spanning what ran
 * inside them, indented by depth). A step's bar is its attempts, with the
 * backoff between them as a gap; an approval's bar is time spent waiting for
 * people, shaded apart from active time. Hovering a bar says its path,
 * status, duration and attempts.
 */
function timeline(records, run) {
  const now = Date.now();
  const endOf = (record) => (record.status === 'pending' ? Math.max(now, record.started_ms) : record.ended_ms);
  const start = Math.min(run.created_ms, ...records.map((record) => record.started_ms));
  const end = Math.max(start + 1, ...records.map(endOf));
  const x = (ms) => LABEL_WIDTH + ((ms - start) / (end - start)) * BARS_WIDTH;
  const width = (from, to) => Math.max(2, x(to) - x(from));

  const rows = [];
  const walk = (nodes, depth) => {
    for (const node of nodes) {
      rows.push({ node, depth });
      walk(node.children, depth + 1);
    }
  };
  walk(stepTree(records), 0);

  const height = AXIS_HEIGHT + rows.length * ROW_HEIGHT + 4;
  const picture = svg('svg', {
    class: 'timeline', testid: 'timeline', width: LABEL_WIDTH + BARS_WIDTH + 16, height,
    viewBox: `0 0 ${LABEL_WIDTH + BARS_WIDTH + 16} ${height}`, role: 'img',
    'aria-label': `Timeline of ${records.length} step execution(s)`,
  });

  // The axis: five ticks, in time since the first record.
  for (let i = 0; i <= 4; i += 1) {
    const ms = start + ((end - start) * i) / 4;
    const at = round(x(ms));
    picture.append(
      svg('line', { class: 'tick', x1: at, x2: at, y1: AXIS_HEIGHT - 6, y2: height }),
      svg('text', { class: 'tick-label', x: at, y: AXIS_HEIGHT - 10, 'text-anchor': i === 4 ? 'end' : i === 0 ? 'start' : 'middle' },
        i === 0 ? clock(start, false) : `+${duration(Math.round(ms - start))}`),
    );
  }

  rows.forEach(({ node, depth }, index) => {
    const top = AXIS_HEIGHT + index * ROW_HEIGHT;
    const middle = top + ROW_HEIGHT / 2;
    const label = svg('text', { class: node.record ? 'row-label' : 'row-label group', x: 4 + depth * 14, y: middle + 4 },
      node.record ? node.label : `${node.label} (${node.kind})`);
    if (!node.record) {
      const inside = recordsOf(node);
      const from = Math.min(...inside.map((record) => record.started_ms));
      const to = Math.max(...inside.map(endOf));
      picture.append(label, svg('g', { class: 'span', testid: 'timeline-group', 'data-path': node.path,
        title: `${node.path} (${node.kind})\n${duration(to - from)}` },
      svg('rect', { class: 'bracket', x: round(x(from)), y: middle - 2, width: round(width(from, to)), height: 4 })));
      return;
    }
    const record = node.record;
    const to = endOf(record);
    const waiting = record.kind === 'approval';
    const attempts = record.attempts ?? [];
    const lines = [
      record.path,
      `${record.kind} · ${record.status} · ${duration(to - record.started_ms)}${waiting ? ' waiting for people' : ''}`,
    ];
    if (attempts.length) lines.push(`${attempts.length} attempt(s)${attempts.some((a) => a.error) ? `: ${attempts.map((a) => a.error ?? 'ok').join('; ')}` : ''}`);
    const bar = svg('g', {
      class: `bar status-${record.status}`, testid: 'timeline-bar', 'data-path': record.path,
      'data-status': record.status, 'data-kind': record.kind, title: lines.join('\n'),
    });
    if (waiting) {
      bar.append(svg('rect', { class: 'waiting', testid: 'waiting', x: round(x(record.started_ms)), y: top + 4, width: round(width(record.started_ms, to)), height: ROW_HEIGHT - 8 }));
    } else if (attempts.some((attempt) => attempt.started_ms !== undefined)) {
      // Each timed attempt a segment; between one's answer and the next's
      // call, the backoff, drawn as a thin line. Before the first call the
      // step may wait (for a place, a model permit, the commit of the
      // record before it): that is no backoff.
      let previousEnd = attempts[0].started_ms ?? record.started_ms;
      for (const attempt of attempts) {
        const from = attempt.started_ms ?? previousEnd;
        const until = attempt.ended_ms ?? to;
        if (from > previousEnd) {
          bar.append(svg('rect', { class: 'backoff', testid: 'backoff', x: round(x(previousEnd)), y: middle - 1, width: round(width(previousEnd, from)), height: 2 }));
        }
        bar.append(svg('rect', {
          class: attempt.error ? 'attempt failed' : 'attempt', testid: 'attempt',
          x: round(x(from)), y: top + 4, width: round(width(from, until)), height: ROW_HEIGHT - 8,
        }));
        previousEnd = until;
      }
    } else {
      // A record from before attempts were timed: one segment.
      bar.append(svg('rect', { class: 'attempt', testid: 'attempt', x: round(x(record.started_ms)), y: top + 4, width: round(width(record.started_ms, to)), height: ROW_HEIGHT - 8 }));
    }
    picture.append(label, bar);
  });

  return h('div', { class: 'picture' },
    picture,
    h('p', { class: 'legend muted' },
      h('span', { class: 'swatch active' }), ' active ',
      h('span', { class: 'swatch failed' }), ' failed attempt ',
      h('span', { class: 'swatch backoff' }), ' backoff ',
      h('span', { class: 'swatch waiting' }), ' waiting for an approval'));
}

// ---- The graph -----------------------------------------------------------

/** The outline of a node's shape in its box. */
function shapeOf(node) {
  const { x, y, width: w, height: hgt } = node;
  const points = (list) => svg('polygon', { points: list.map(([px, py]) => `${round(px)},${round(py)}`).join(' ') });
  const slant = 12;
  switch (node.shape) {
    case 'terminal': return svg('rect', { x, y, width: w, height: hgt, rx: hgt / 2 });
    case 'hexagon': return points([[x + slant, y], [x + w - slant, y], [x + w, y + hgt / 2], [x + w - slant, y + hgt], [x + slant, y + hgt], [x, y + hgt / 2]]);
    case 'diamond': return points([[x + w / 2, y], [x + w, y + hgt / 2], [x + w / 2, y + hgt], [x, y + hgt / 2]]);
    case 'flag': return points([[x, y], [x + w, y], [x + w, y + hgt], [x, y + hgt], [x + slant, y + hgt / 2]]);
    case 'fork': return points([[x + slant, y], [x + w - slant, y], [x + w, y + hgt], [x, y + hgt]]);
    case 'join': return points([[x, y], [x + w, y], [x + w - slant, y + hgt], [x + slant, y + hgt]]);
    case 'circle': return svg('circle', { cx: x + w / 2, cy: y + hgt / 2, r: w / 2 });
    case 'cylinder': return svg('path', { d: `M${x},${y + 5} a${w / 2},5 0 0,0 ${w},0 a${w / 2},5 0 0,0 ${-w},0 v${hgt - 10} a${w / 2},5 0 0,0 ${w},0 v${-(hgt - 10)}` });
    case 'subroutine': return svg('g', {},
      svg('rect', { x, y, width: w, height: hgt }),
      svg('line', { x1: x + 6, x2: x + 6, y1: y, y2: y + hgt }),
      svg('line', { x1: x + w - 6, x2: x + w - 6, y1: y, y2: y + hgt }));
    default: return svg('rect', { x, y, width: w, height: hgt, rx: 4 });
  }
}

const MARK_WORDS = { taken: 'the run went through it', current: 'the run is here', not_taken: 'not reached' };

/**
 * The workflow's flowchart as flowd laid it out from the run's plan: the
 * path the run took drawn strong, the rest faint, and where it is now (a
 * parked gate, a step between attempts) ringed and labelled.
 */
function graphView(graph) {
  const margin = 8;
  const width = graph.width + 2 * margin + 90;
  const height = graph.height + 2 * margin;
  const picture = svg('svg', {
    class: 'graph', testid: 'graph', width, height, viewBox: `${-margin} ${-margin} ${width} ${height}`,
    role: 'img', 'aria-label': `The graph of workflow ${graph.workflow}`,
  },
  svg('defs', {},
    ['arrow', 'arrow-taken'].map((id) => svg('marker', {
      id, viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse',
    }, svg('path', { d: 'M0,0 L10,5 L0,10 z', class: id })))));
  for (const frame of graph.frames) {
    picture.append(svg('g', {
      class: `frame mark-${frame.mark}`, testid: 'graph-frame', 'data-path': frame.path, 'data-mark': frame.mark,
      title: `${frame.full}\n${MARK_WORDS[frame.mark] ?? frame.mark}`,
    },
    svg('rect', { x: frame.x, y: frame.y, width: frame.width, height: frame.height, rx: 6 }),
    svg('text', { x: frame.x + 8, y: frame.y + 16 }, frame.title)));
  }
  for (const edge of graph.edges) {
    const [first, ...rest] = edge.points;
    const d = `M${first.map(round).join(',')} ${rest.map((point) => `L${point.map(round).join(',')}`).join(' ')}`;
    const last = edge.points.at(-2);
    picture.append(svg('g', {
      class: `edge${edge.taken ? ' taken' : ''}${edge.dashed ? ' dashed' : ''}`, testid: 'graph-edge',
      'data-from': edge.from, 'data-to': edge.to, 'data-taken': String(edge.taken), title: edge.full ?? undefined,
    },
    svg('path', { d, 'marker-end': `url(#${edge.taken ? 'arrow-taken' : 'arrow'})` }),
    edge.label ? svg('text', { class: 'edge-label', x: round(last[0] + 4), y: round(last[1] - 3) }, edge.label) : null));
  }
  for (const node of graph.nodes) {
    const lines = node.label.length;
    const words = [
      node.path ?? node.label.join(' '),
      MARK_WORDS[node.mark] ?? node.mark,
      node.statuses.length ? `records: ${node.statuses.join(', ')}` : null,
    ].filter(Boolean);
    const group = svg('g', {
      class: `node shape-${node.shape} mark-${node.mark}`, testid: 'graph-node', 'data-id': node.id,
      'data-path': node.path, 'data-mark': node.mark, title: words.join('\n'),
    }, shapeOf(node));
    group.firstChild.classList.add('shape');
    node.label.forEach((line, index) => {
      const y = node.y + node.height / 2 + (index - (lines - 1) / 2) * 16 + 4;
      group.append(svg('text', { x: node.x + node.width / 2, y: round(y), 'text-anchor': 'middle', class: index ? 'second' : '' }, line));
    });
    if (node.mark === 'current') {
      const parked = node.statuses.includes('pending');
      group.append(
        svg('rect', { class: 'ring', x: node.x - 4, y: node.y - 4, width: node.width + 8, height: node.height + 8, rx: 8 }),
        svg('text', { class: 'here', testid: 'graph-here', x: node.x + node.width + 10, y: node.y + node.height / 2 + 4 },
          parked ? '◀ parked here' : '◀ here'),
      );
    }
    picture.append(group);
  }
  return h('div', { class: 'picture' }, picture,
    h('p', { class: 'legend muted' }, 'Bold: the path this run took. Ringed: where it is now. Hover for details.'));
}
