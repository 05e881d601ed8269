// envd's Connect services through dsec's E2B door, driven by the unmodified
// `e2b` SDK: commands (run, streamed callbacks, exit codes, as the SDK's
// default user `user` and as root, a timeout) and the filesystem calls
// (list with depth, exists, getInfo, makeDir, rename, remove, watchDir),
// reconnecting to a command; prints what it saw as one JSON object.
const { Sandbox, failure, main } = require('./common.cjs');

main(async () => {
  const out = {};
  const sbx = await Sandbox.create(process.env.TEMPLATE, { timeoutMs: 120000 });
  out.id = sbx.sandboxId;
  try {
    // Commands: foreground, output as it comes, in order.
    const chunks = [];
    const r = await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.2; done; echo err >&2', {
      onStdout: (d) => chunks.push(['out', d, Date.now()]),
      onStderr: (d) => chunks.push(['err', d, Date.now()]),
    });
    out.run = { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr };
    out.chunks = chunks.map((c) => [c[0], c[1]]);
    const outs = chunks.filter((c) => c[0] === 'out');
    out.streamedSpanMs = outs.length ? outs[outs.length - 1][2] - outs[0][2] : 0;
    out.whoami = (await sbx.commands.run('id -un; echo $HOME; pwd')).stdout;
    out.rootWho = (await sbx.commands.run('id -u; pwd', { user: 'root' })).stdout;
    out.envs = (await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar baz' }, cwd: '/tmp' })).stdout;
    out.exit3 = await failure(() => sbx.commands.run('echo partial; exit 3'));
    try {
      await sbx.commands.run('exit 3');
    } catch (e) {
      out.exit3Code = e.exitCode;
    }
    out.timeout = await failure(() => sbx.commands.run('sleep 30', { timeoutMs: 1000 }));
    out.unknownUser = await failure(() => sbx.commands.run('true', { user: 'nosuchuser' }));
    const bg = await sbx.commands.run('echo $$; sleep 0.3; echo done', { background: true });
    out.bgPidIsBash = (await bg.wait()).stdout === `${bg.pid}\ndone\n`;
    // Processes by pid: stdin written and closed, listed, killed.
    const cat = await sbx.commands.run('head -n 2', { background: true, stdin: true });
    await cat.sendStdin('hello\n');
    await sbx.commands.sendStdin(cat.pid, 'world\n');
    out.cat = (await cat.wait()).stdout;
    const reader = await sbx.commands.run('cat; echo end', { background: true, stdin: true });
    await reader.sendStdin('a\n');
    await sbx.commands.closeStdin(reader.pid);
    out.closedStdin = (await reader.wait()).stdout;
    out.catNoStdin = (await sbx.commands.run('cat', { timeoutMs: 10000 })).stdout;
    const sleeper = await sbx.commands.run('sleep 30', { background: true });
    out.listed = (await sbx.commands.list()).filter((p) => p.pid === sleeper.pid).map((p) => [p.cmd, p.args]);
    out.killed = await sleeper.kill();
    out.sleeperEnd = await failure(() => sleeper.wait());
    out.killAgain = await sbx.commands.kill(sleeper.pid);
    out.inputToGone = await failure(() => sbx.commands.sendStdin(sleeper.pid, 'x'));
    // A command outlives its caller's disconnect; connect attaches to it by pid (output from then on).
    const lone = await sbx.commands.run('read l; echo got $l', { background: true, stdin: true });
    await lone.disconnect();
    const rejoined = [];
    const again = await sbx.commands.connect(lone.pid, { onStdout: (d) => rejoined.push(d) });
    await sbx.commands.sendStdin(lone.pid, 'x\n');
    const end = await again.wait();
    out.reconnected = { pid: again.pid === lone.pid, exitCode: end.exitCode, stdout: end.stdout, seen: rejoined.join('') };
    out.connectGone = await failure(() => sbx.commands.connect(lone.pid));
    // Bad Connect input: each answered with Connect's invalid_argument, nothing run.
    const raw = (path, type, body) => fetch(`${process.env.E2B_SANDBOX_URL}${path}`, {
      method: 'POST', body,
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken, 'Content-Type': type },
    }).then(async (r) => [r.status, Buffer.from(await r.arrayBuffer()).toString('latin1')]);
    out.truncated = await raw('/process.Process/Start', 'application/connect+json', new Uint8Array([0, 0, 0]));
    out.claims1GiB = await raw('/process.Process/Start', 'application/connect+json',
      new Uint8Array([0, 0x40, 0, 0, 0, 0x7b, 0x7d]));
    out.notJson = await raw('/filesystem.Filesystem/Stat', 'application/json', 'not json');
    out.protoBody = await raw('/filesystem.Filesystem/Stat', 'application/proto', 'x');
    // envd's polled watchers (E2B's Python SDK's watch_dir): made, polled, removed.
    const unary = (method, body) => raw(`/filesystem.Filesystem/${method}`, 'application/json', JSON.stringify(body))
      .then(([code, text]) => [code, JSON.parse(text)]);
    await sbx.files.makeDir('/tmp/polled');
    const [, made] = await unary('CreateWatcher', { path: '/tmp/polled', recursive: true, includeEntry: true });
    await sbx.commands.run('echo x > /tmp/polled/f');
    const polled = [];
    const wrote = () => polled.some((e) => e.name === 'f' && e.type === 'EVENT_TYPE_WRITE');
    for (let i = 0; i < 100 && !wrote(); i++) {
      const [, r] = await unary('GetWatcherEvents', { watcherId: made.watcherId });
      polled.push(...(r.events || []));
      if (!wrote()) await new Promise((res) => setTimeout(res, 100));
    }
    out.polled = polled.filter((e) => e.type !== 'EVENT_TYPE_CHMOD').map((e) => [e.type, e.name]);
    const wroteEntry = polled.find((e) => e.type === 'EVENT_TYPE_WRITE').entry;
    out.polledEntry = wroteEntry && [wroteEntry.path, wroteEntry.type, wroteEntry.size];
    out.pollAgain = await unary('GetWatcherEvents', { watcherId: made.watcherId });
    out.removedWatcher = await unary('RemoveWatcher', { watcherId: made.watcherId });
    out.pollRemoved = await unary('GetWatcherEvents', { watcherId: made.watcherId });
    out.watcherMissingDir = await unary('CreateWatcher', { path: '/tmp/nowhere' });
    out.watcherNoId = await unary('GetWatcherEvents', {});
    // A terminal: resized, typed into, its output as it comes.
    const seen = [];
    const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => seen.push(Buffer.from(d).toString()) });
    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 });
    const type = (s) => sbx.pty.sendInput(term.pid, new TextEncoder().encode(s));
    await type('python3 -c "import os; print(\'tty\', *os.get_terminal_size(), os.isatty(0), os.getsid(0) == os.getpid())"\n');
    await type('exit 7\n');
    out.ptyEnd = await failure(() => term.wait());
    out.ptyOut = seen.join('');

    // Filesystem.
    out.madeDir = await sbx.files.makeDir('/tmp/fs/a/b');
    out.madeAgain = await sbx.files.makeDir('/tmp/fs/a/b');
    out.dirOwner = (await sbx.files.getInfo('/tmp/fs')).owner;
    await sbx.files.write('/tmp/fs/a/one.txt', '1');
    await sbx.files.write('/tmp/fs/a/b/two.txt', '22');
    out.list1 = (await sbx.files.list('/tmp/fs')).map((e) => [e.path, e.type]);
    out.list3 = (await sbx.files.list('/tmp/fs', { depth: 3 })).map((e) => [e.path, e.type, e.type === 'file' ? e.size : null]);
    out.exists = await sbx.files.exists('/tmp/fs/a/one.txt');
    out.existsNot = await sbx.files.exists('/tmp/fs/none');
    const info = await sbx.files.getInfo('/tmp/fs/a/one.txt');
    out.info = { name: info.name, type: info.type, size: info.size, mode: info.mode, permissions: info.permissions,
                 owner: info.owner, group: info.group, recent: Math.abs(Date.now() - info.modifiedTime) < 600000 };
    out.homeInfo = await sbx.files.getInfo('notes.txt').catch((e) => e.constructor.name);
    await sbx.files.write('notes.txt', 'relative');
    out.relative = (await sbx.commands.run('cat /home/user/notes.txt; stat -c %U /home/user/notes.txt')).stdout;
    const moved = await sbx.files.rename('/tmp/fs/a/one.txt', '/tmp/fs/uno.txt');
    out.moved = [moved.path, moved.name, await sbx.files.exists('/tmp/fs/a/one.txt')];
    await sbx.files.remove('/tmp/fs/a');
    out.afterRemove = (await sbx.files.list('/tmp/fs', { depth: 5 })).map((e) => e.path);
    out.listFile = await failure(() => sbx.files.list('/tmp/fs/uno.txt'));
    out.listMissing = await failure(() => sbx.files.list('/tmp/nowhere'));
    // Watches: events as they happen, named relative to the directory; recursive sees into new directories.
    await sbx.files.makeDir('/tmp/wd');
    const events = [];
    const waiting = [];  // [type, name, resolve]: resolved when that event comes
    const until = (type, name) => new Promise((resolve) => waiting.push([type, name, resolve]));
    const entries = {};  // envd 0.6.3: each event's entry (includeEntry), where the path can be stat-ed
    const watch = await sbx.files.watchDir('/tmp/wd', (e) => {
      events.push([e.type, e.name]);
      entries[`${e.type} ${e.name}`] = e.entry ? [e.entry.path, e.entry.type, e.entry.type === 'file' ? e.entry.size : null] : null;
      for (const w of waiting) if (w[0] === e.type && w[1] === e.name) w[2]();
    }, { recursive: true, includeEntry: true });
    const subMade = until('create', 'sub');
    await sbx.files.makeDir('/tmp/wd/sub');
    await subMade;  // its watch is added as its create is read
    const fileWritten = until('write', 'sub/f.txt');
    await sbx.files.write('/tmp/wd/sub/f.txt', 'x');
    await fileWritten;
    const fileRemoved = until('remove', 'sub/f.txt');
    await sbx.files.remove('/tmp/wd/sub/f.txt');
    await fileRemoved;
    await watch.stop();
    out.watched = events.filter((e) => e[0] !== 'chmod');
    out.watchEntries = [entries['create sub'], entries['write sub/f.txt'], entries['remove sub/f.txt']];
    out.watchMissing = await failure(() => sbx.files.watchDir('/tmp/nowhere', () => {}));
    out.removeMissing = await failure(() => sbx.files.remove('/tmp/never-was'));
    await sbx.commands.run('cd /tmp && ln -s uno.txt /tmp/fs/link');
    out.linkTarget = (await sbx.files.getInfo('/tmp/fs/link')).symlinkTarget;
    // A pause with a command running pauses it too; after connect it is listed and can be attached to.
    const busy = await sbx.commands.run('sleep 30', { background: true });
    out.pauseBusy = [await sbx.pause(), await sbx.isRunning()];
    await Sandbox.connect(sbx.sandboxId);
    out.busyListed = (await sbx.commands.list()).some((c) => c.pid === busy.pid);
    out.busyAttached = (await sbx.commands.connect(busy.pid)).pid === busy.pid;
    await busy.kill();
    // A command running when its sandbox is killed: its stream is cut, and the SDK says the sandbox is gone.
    const doomed = await sbx.commands.run('sleep 60', { background: true });
    await sbx.kill();
    out.killedDuringRun = await failure(() => doomed.wait());
  } finally {
    await sbx.kill().catch(() => {});  // killed already, unless something failed first
  }
  return out;
});
