// The run inspector in headless Chromium, as a person would use it: enter an
// API key and an email, open a run parked at an approval, read its steps,
// approve, and watch the run complete. Run by tests/inspector.rs as
//
//   MARKUP=... node inspector.mjs URL API_KEY RUN_ID SCREENSHOT.png
//
// MARKUP is the run's input note, markup that must show as text. Pictures
// of the timeline and the graph go beside SCREENSHOT.png
// (`…-timeline.png`, `…-graph.png`).
//
// It exits 0 when every expectation held, 1 with a message saying which did
// not (and a screenshot of the page as it was), 2 when it cannot start.

import { execFileSync } from 'node:child_process';
import { chromium } from 'playwright-core';

const APPROVER = 'boss@acme.io';
const COMMENT = 'Ship it.';
// The whole script's budget: a hung page must fail the test, not stall it.
const DEADLINE_MS = 90_000;
// How long one expectation may take to come true.
const EXPECT_MS = 15_000;

const [url, key, runId, screenshot] = process.argv.slice(2);
const MARKUP = process.env.MARKUP ?? '';
const picture = (name) => screenshot.replace(/\.png$/, `-${name}.png`);
if (!screenshot) {
  console.error('usage: node inspector.mjs URL API_KEY RUN_ID SCREENSHOT.png');
  process.exit(2);
}

/** Debian's chromium, wherever PATH finds it. */
function chromiumPath() {
  try {
    return execFileSync('sh', ['-c', 'command -v chromium'], { encoding: 'utf8' }).trim();
  } catch {
    return '/usr/bin/chromium';
  }
}

class Unmet extends Error {}

/**
 * Waits until `check` returns true; it returns anything else to say what it
 * saw instead, which the failure message quotes.
 */
async function until(expectation, check, timeoutMs = EXPECT_MS) {
  const deadline = Date.now() + timeoutMs;
  let seen;
  for (;;) {
    try {
      seen = await check();
      if (seen === true) return;
    } catch (error) {
      seen = error.message.split('\n')[0];
    }
    if (Date.now() > deadline) throw new Unmet(`${expectation}; saw: ${seen}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

const step = (message) => console.log(`inspector.mjs: ${message}`);

const timer = setTimeout(() => {
  console.error(`inspector.mjs: FAILED: not done within ${DEADLINE_MS / 1000} s`);
  process.exit(1);
}, DEADLINE_MS);

const browser = await chromium.launch({
  executablePath: chromiumPath(),
  headless: true,
  args: ['--no-sandbox'],
});
let failure = null;
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  // Nothing on this path should go wrong, so any error the page reports is
  // a failure: an exception in its script, inline script or style that the
  // Content-Security-Policy blocked, or a request that was refused.
  const pageProblems = [];
  page.on('pageerror', (error) => pageProblems.push(`uncaught: ${error.message}`));
  page.on('console', (message) => {
    if (message.type() === 'error') pageProblems.push(`console: ${message.text()}`);
  });
  page.on('response', (response) => {
    if (response.status() >= 400) pageProblems.push(`HTTP ${response.status()}: ${response.url()}`);
  });
  const attribute = (locator, name) => locator.getAttribute(name, { timeout: 500 });
  const text = async (locator) => (await locator.textContent({ timeout: 500 }))?.trim();

  step(`open ${url}/inspector`);
  const response = await page.goto(`${url}/inspector`);
  if (response?.status() !== 200) throw new Unmet(`/inspector answered ${response?.status()}`);
  await until('the page asks for an API key', async () =>
    (await page.getByTestId('need-key').isVisible()) || 'no prompt for a key');

  step('enter the API key and the approver');
  await page.getByTestId('api-key').fill(key);
  await page.getByTestId('approver').fill(APPROVER);
  await page.getByTestId('save-identity').click();

  const row = page.locator(`[data-testid="run-row"][data-run-id="${runId}"]`);
  await until('the runs list shows the run as pending_approval', async () => {
    const status = await text(row.getByTestId('run-row-status'));
    return status === 'pending_approval' || `status ${status}`;
  });

  step('open the run from the list');
  await row.getByRole('link').click();
  await until('the address is the run\'s', async () =>
    page.url().endsWith(`#/runs/${runId}`) || page.url());
  await until('the run shows pending_approval', async () => {
    const status = await text(page.getByTestId('run-status'));
    return status === 'pending_approval' || `status ${status}`;
  });

  const stepAt = (path) => page.locator(`[data-testid="step"][data-path="${path}"]`);
  const expectStep = async (path, kind, status) => {
    await until(`step ${path} shows as a ${status} ${kind}`, async () => {
      const seen = [await attribute(stepAt(path), 'data-kind'), await attribute(stepAt(path), 'data-status')];
      const shown = await text(stepAt(path).getByTestId('step-status').first());
      return (seen[0] === kind && seen[1] === status && shown === status) || `${seen.join(' ')}, badge ${shown}`;
    });
  };
  step('read the steps');
  await expectStep('outline', 'recipe', 'completed');
  await expectStep('signoff', 'approval', 'pending');
  // Nested steps sit under their loop iteration and parallel branch.
  for (const [group, path] of [['sections', 'sections[1]/section'], ['checks', 'checks/legal/terms']]) {
    await until(`step ${path} is nested under ${group}`, async () => {
      const nested = page.locator(`[data-testid="group"][data-path="${group}"] [data-testid="step"][data-path="${path}"]`);
      return (await nested.count()) === 1 || 'not found under it';
    });
  }
  await until('the later step has not run yet', async () =>
    (await stepAt('publish').count()) === 0 || 'step publish is shown');

  // The gate's message holds markup; the page must show it as text.
  const gate = page.locator('[data-testid="gate"][data-path="signoff"]');
  await until('the gate shows its message as text', async () => {
    const message = await text(gate.getByTestId('gate-message'));
    return message === 'Publish <img src=x data-injected=1>?' || `message ${message}`;
  });
  if ((await page.locator('[data-injected]').count()) !== 0) {
    throw new Unmet('the gate\'s message was rendered as HTML');
  }
  await until('the gate lists its approvers', async () => {
    const approvers = await text(gate.getByTestId('gate-approvers'));
    return approvers === `Approvers: ${APPROVER}` || approvers;
  });

  step('read the timeline');
  const trace = await (await fetch(`${url}/v1/runs/${encodeURIComponent(runId)}/trace`, {
    headers: { Authorization: `Bearer ${key}` },
  })).json();
  const bars = page.getByTestId('timeline-bar');
  await until(`the timeline has a bar for each of the ${trace.steps.length} step executions`, async () => {
    const paths = await bars.evaluateAll((all) => all.map((bar) => bar.dataset.path));
    const wanted = trace.steps.map((record) => record.path);
    return (paths.length === wanted.length && wanted.every((path) => paths.includes(path))) || `bars for ${paths.join(', ')}`;
  });
  await until('only the approval\'s bar is shaded as waiting for people', async () => {
    const waiting = await page.locator('[data-testid="timeline-bar"]:has([data-testid="waiting"])')
      .evaluateAll((all) => all.map((bar) => bar.dataset.path));
    return (waiting.length === 1 && waiting[0] === 'signoff') || `waiting: ${waiting.join(', ')}`;
  });
  await until('the other bars are active time, a segment per attempt, the outline\'s failed one and its backoff apart', async () => {
    const parts = await bars.evaluateAll((all) => all.filter((bar) => bar.dataset.kind !== 'approval')
      .map((bar) => [bar.dataset.path, ...['attempt', 'backoff'].map((part) => bar.querySelectorAll(`[data-testid="${part}"]`).length),
        bar.querySelectorAll('.attempt.failed').length]));
    const ok = parts.every(([path, attempts, backoffs, failed]) => (path === 'outline'
      ? attempts === 2 && backoffs === 1 && failed === 1
      : attempts === 1 && backoffs === 0 && failed === 0));
    return ok || JSON.stringify(parts);
  });
  await until('the backoff lies between the two attempts', async () => {
    const boxes = await page.locator('[data-testid="timeline-bar"][data-path="outline"] rect')
      .evaluateAll((all) => all.map((rect) => [rect.dataset.testid, Number(rect.getAttribute('x')), Number(rect.getAttribute('width'))]));
    const [first, gap, second] = boxes;
    return (first[0] === 'attempt' && gap[0] === 'backoff' && second[0] === 'attempt'
      && gap[1] >= first[1] + first[2] - 0.5 && second[1] >= gap[1] + gap[2] - 0.5 && gap[2] > 10) || JSON.stringify(boxes);
  });
  await until('a bar\'s hover text gives its path, status, duration and attempts', async () => {
    const title = await page.locator('[data-testid="timeline-bar"][data-path="outline"] > title').textContent({ timeout: 500 });
    return (/^outline\nrecipe · completed · \d+(\.\d)? m?s\n2 attempt\(s\): rate_limited: the model provider failed .*reference llm-.*; ok$/.test(title)) || title;
  });
  await until('loops and parallels are bracket rows in the timeline', async () => {
    const groups = await page.getByTestId('timeline-group').evaluateAll((all) => all.map((g) => g.dataset.path));
    return ['sections', 'sections[0]', 'checks', 'checks/legal'].every((path) => groups.includes(path)) || groups.join(', ');
  });
  await page.getByTestId('timeline').screenshot({ path: picture('timeline') });

  step('read the graph');
  const node = (path) => page.locator(`[data-testid="graph-node"][data-path="${path}"]`);
  const markOf = async (path) => attribute(node(path), 'data-mark');
  await until('the graph marks the steps the run took, the gate it is parked at and what is still ahead', async () => {
    const marks = {};
    for (const path of ['outline', 'sections[]/section', 'checks/legal/terms', 'signoff', 'publish']) marks[path] = await markOf(path);
    const wanted = { outline: 'taken', 'sections[]/section': 'taken', 'checks/legal/terms': 'taken', signoff: 'current', publish: 'not_taken' };
    return JSON.stringify(marks) === JSON.stringify(wanted) || JSON.stringify(marks);
  });
  await until('the parked gate is labelled', async () =>
    (await text(node('signoff').getByTestId('graph-here'))) === '◀ parked here' || 'no label');
  await until('the edges into the gate are taken, the one out of it is not', async () => {
    const id = async (path) => attribute(node(path), 'data-id');
    const [gateId, publishId] = [await id('signoff'), await id('publish')];
    const into = await attribute(page.locator(`[data-testid="graph-edge"][data-to="${gateId}"]`), 'data-taken');
    const out = await attribute(page.locator(`[data-testid="graph-edge"][data-to="${publishId}"]`), 'data-taken');
    return (into === 'true' && out === 'false') || `into ${into}, out ${out}`;
  });
  await until('the condition\'s markup is a label\'s text', async () => {
    const titles = await page.locator('[data-testid="graph-edge"] > title').allTextContents();
    return titles.some((title) => title.includes('"\\"><img src=x onerror=alert(1) data-injected=1>"')) || titles.join(' | ');
  });
  await page.getByTestId('graph').screenshot({ path: picture('graph') });

  step('the run\'s markup stays text');
  await until('the step\'s input shows the note as text', async () =>
    (await text(stepAt('outline').locator('.json').first())).includes(JSON.stringify(MARKUP).slice(1, -1)) || 'not shown');
  const injected = await page.evaluate(() => ({
    marked: document.querySelectorAll('[data-injected]').length,
    images: document.querySelectorAll('img').length,
    scripts: document.querySelectorAll('script').length,
    flag: document.body.dataset.injected ?? null,
  }));
  if (injected.marked || injected.images || injected.scripts !== 1 || injected.flag !== null) {
    throw new Unmet(`run data was rendered as HTML: ${JSON.stringify(injected)}`);
  }

  step('approve');
  await gate.getByTestId('comment').fill(COMMENT);
  await gate.getByTestId('approve').click();
  await until('the run completes', async () => {
    const status = await text(page.getByTestId('run-status'));
    const refusal = await gate.getByTestId('gate-status').textContent({ timeout: 100 }).catch(() => null);
    return status === 'completed' || `status ${status}${refusal ? `, gate says: ${refusal}` : ''}`;
  });
  await expectStep('signoff', 'approval', 'completed');
  await expectStep('publish', 'recipe', 'completed');
  await until('the output names the approver', async () =>
    (await text(page.getByTestId('run-output'))).includes(APPROVER) || 'no approver in the output');

  await until('after the decision the graph takes the run to its end', async () => {
    const marks = [await markOf('signoff'), await markOf('publish')];
    const end = await attribute(page.locator('[data-testid="graph-node"][data-id="n_end"]'), 'data-mark');
    return (marks.join() === 'taken,taken' && end === 'taken') || `${marks.join()}, end ${end}`;
  });
  await until('the timeline has a bar for the step after the gate too', async () => (await bars.count()) === trace.steps.length + 1 || `${await bars.count()} bars`);
  await until('the output shows the note as text', async () =>
    (await text(page.getByTestId('run-output'))).includes(JSON.stringify(MARKUP).slice(1, -1)) || 'not shown');

  step('open the gate\'s details');
  await stepAt('signoff').locator('summary').first().click();
  await until('the gate\'s details show the decision and its comment', async () => {
    const details = await text(stepAt('signoff').locator('.step-body').first());
    return (details.includes(`"approver": "${APPROVER}"`) && details.includes(COMMENT)) || details;
  });

  if (pageProblems.length) throw new Unmet(`the page reported problems:\n  ${pageProblems.join('\n  ')}`);
  await page.screenshot({ path: screenshot, fullPage: true });
  step(`screenshot: ${screenshot}`);
} catch (error) {
  failure = error;
  const page = browser.contexts()[0]?.pages()[0];
  // The page as it was when the expectation failed is the best clue.
  await page?.screenshot({ path: screenshot, fullPage: true }).catch(() => {});
}
await browser.close();
clearTimeout(timer);
if (failure) {
  const what = failure instanceof Unmet ? failure.message : failure.stack;
  console.error(`inspector.mjs: FAILED: ${what}\n(the page at that moment: ${screenshot})`);
  process.exit(1);
}
step('every expectation held');
