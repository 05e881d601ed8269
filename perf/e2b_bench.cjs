// The E2B door's half of perf/e2b_bench (run by it, not by hand): the
// unmodified `e2b` SDK (its module in E2B_MODULE) against dsecd's door.
//   MODE=latency COUNT=N: N times in a row, Sandbox.create(TEMPLATE), then
//     commands.run('echo hi') until its first stdout; the ms of each.
//   MODE=rate CONC=C SECONDS=S: C loops of commands.run('true') on one
//     sandbox for S seconds; how many ended, and how many failed.
//   MODE=streams COUNT=N LINES=L DIR=D: N sandboxes, 32 made at a time,
//     each running `read; seq L` in the background with its output
//     streamed; once every stream is open (each said it started), D/open is
//     made and the bench waits for D/go (dsecd's memory is read meanwhile);
//     then each is sent its line and its L lines checked, in order; D/ended
//     is made and the bench waits for D/done before killing them all.
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

async function until(file) {
  const fs = require('fs');
  while (!fs.existsSync(file)) await new Promise((r) => setTimeout(r, 100));
}

async function streams(count, lines, dir) {
  const fs = require('fs');
  const t0 = process.hrtime.bigint();
  const made = [];
  let failed = 0;
  for (let at = 0; at < count; at += 32) {
    await Promise.all(Array.from({ length: Math.min(32, count - at) }, async () => {
      try {
        const sbx = await Sandbox.create(process.env.TEMPLATE, { timeoutMs: 1800000 });
        const s = { sbx, text: '' };
        let started;
        const seen = new Promise((resolve) => { started = resolve; });
        s.handle = await sbx.commands.run('echo started; read x; seq ' + lines, {
          background: true, stdin: true, timeoutMs: 0,
          onStdout: (d) => { s.text += d; started(); },
        });
        await seen;
        made.push(s);
      } catch (e) {
        failed++;
        if (failed < 4) console.error(e);
      }
    }));
  }
  const openMs = Number(process.hrtime.bigint() - t0) / 1e6;
  fs.writeFileSync(dir + '/open', String(made.length));
  await until(dir + '/go');
  const want = 'started\n' + Array.from({ length: lines }, (_, i) => String(i + 1) + '\n').join('');
  let inOrder = 0;
  await Promise.all(made.map(async (s) => {
    try {
      await s.handle.sendStdin('go\n');
      await s.handle.wait();
      if (s.text === want) inOrder++;
    } catch (e) {
      failed++;
    }
  }));
  fs.writeFileSync(dir + '/ended', '');
  await until(dir + '/done');
  await Promise.all(made.map((s) => s.sbx.kill().catch(() => {})));
  return { made: made.length, inOrder, failed, openMs };
}

(async () => {
  const mode = process.env.MODE;
  const out = mode === 'latency' ? await latency(Number(process.env.COUNT))
            : mode === 'streams' ? await streams(Number(process.env.COUNT), Number(process.env.LINES), process.env.DIR)
                                 : await rate(Number(process.env.CONC), Number(process.env.SECONDS));
  console.log(JSON.stringify(out));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
