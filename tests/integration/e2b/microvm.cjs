// The unmodified SDK against a microVM through the door (metadata
// dsec.kind: a template's kind): commands streamed and in the background,
// files, a watch, a service by its port, pause with a command running and
// connect; prints what it saw as one JSON object.
const { Sandbox, main } = require('./common.cjs');

main(async () => {
  const out = {};
  const sbx = await Sandbox.create(process.env.TEMPLATE, { metadata: { 'dsec.kind': process.env.KIND }, timeoutMs: 300000 });
  out.id = sbx.sandboxId;
  try {
    const seen = [];
    const run = await sbx.commands.run('for i in 1 2 3; do echo line $i; done; echo err >&2; exit 4', {
      onStdout: (d) => seen.push(d), user: 'root',
    }).catch((e) => e.result);
    out.run = [run.exitCode, run.stdout, run.stderr, seen.join('')];
    out.hostname = (await sbx.commands.run('cat /proc/sys/kernel/hostname', { user: 'root' })).stdout.trim();
    await sbx.files.write('/tmp/vm/a.txt', 'in a guest');
    out.read = await sbx.files.read('/tmp/vm/a.txt');
    out.list = (await sbx.files.list('/tmp/vm')).map((e) => e.name);
    const events = [];
    let wrote;
    const written = new Promise((r) => { wrote = r; });
    const watch = await sbx.files.watchDir('/tmp/vm', (e) => {
      events.push([e.type, e.name]);
      if (e.name === 'b.txt' && e.type === 'write') wrote();
    });
    await sbx.files.write('/tmp/vm/b.txt', 'b');
    await written;
    await watch.stop();
    out.watched = events.some((e) => e[0] === 'create' && e[1] === 'b.txt');
    // A service in the guest by its port (the guest has no network link).
    await sbx.files.write('/tmp/www/hello.txt', 'hello from a guest');
    const server = await sbx.commands.run('python3 -m http.server 8000 -d /tmp/www', { background: true, user: 'root' });
    const port = () => fetch(`${process.env.E2B_SANDBOX_URL}/hello.txt`,
      { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' } });
    let r = await port();
    for (let i = 0; i < 200 && r.status !== 200; i++) {  // until the server listens
      await new Promise((res) => setTimeout(res, 100));
      r = await port();
    }
    out.port = [r.status, await r.text()];
    await server.kill();
    // Paused with a command running: after connect it goes on, found by its pid.
    const busy = await sbx.commands.run('sleep 600', { background: true, user: 'root' });
    await sbx.pause();
    out.pausedState = (await sbx.getInfo()).state;
    await Sandbox.connect(sbx.sandboxId);
    out.resumedState = (await sbx.getInfo()).state;
    out.busyListed = (await sbx.commands.list()).some((c) => c.pid === busy.pid);
    out.afterResume = (await sbx.files.read('/tmp/vm/a.txt'));
    await sbx.commands.kill(busy.pid);
  } finally {
    out.killed = await sbx.kill();
  }
  return out;
});
