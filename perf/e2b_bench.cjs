// The E2B door's half of perf/e2b_bench (run by it, not by hand): the
// unmodified `e2b` SDK (its module in E2B_MODULE) against dsecd's door.
//   MODE=latency COUNT=N: N times in a row, Sandbox.create(TEMPLATE), then
//     commands.run('echo hi') until its first stdout; the ms of each.
//   MODE=rate CONC=C SECONDS=S: C loops of commands.run('true') on one
//     sandbox for S seconds; how many ended, and how many failed.
// Prints one JSON object.
const { Sandbox } = require(process.env.E2B_MODULE);

async function latency(count) {
  const ms = [];
  for (let i = 0; i < count; i++) {
    const t0 = process.hrtime.bigint();
    const sbx = await Sandbox.create(process.env.TEMPLATE, { timeoutMs: 120000 });
    let first;
    const seen = new Promise((resolve) => { first = resolve; });
    const run = sbx.commands.run('echo hi', { onStdout: () => first() });
    await seen;
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
    await run;
    await sbx.kill();
  }
  return { ms };
}

async function rate(conc, seconds) {
  const sbx = await Sandbox.create(process.env.TEMPLATE, { timeoutMs: 120000 });
  const end = Date.now() + seconds * 1000;
  let done = 0;
  let failed = 0;
  const t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: conc }, async () => {
    while (Date.now() < end) {
      try {
        await sbx.commands.run('true');
        done++;
      } catch (e) {
        failed++;
      }
    }
  }));
  const elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
  await sbx.kill();
  return { done, failed, seconds: elapsed };
}

(async () => {
  const mode = process.env.MODE;
  const out = mode === 'latency' ? await latency(Number(process.env.COUNT))
                                 : await rate(Number(process.env.CONC), Number(process.env.SECONDS));
  console.log(JSON.stringify(out));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
