// The `base` template (dsec-image build --debian ... --user user base, as
// docs/e2b.md says) through the unmodified SDK, as E2B's own tests use it:
// the default user `user` with its home, a sudo rule, python3, git, curl;
// prints what it saw as one JSON object.
const { Sandbox, main } = require('./common.cjs');

main(async () => {
  const sbx = await Sandbox.create('base', { timeoutMs: 120000 });
  try {
    const run = async (cmd, opts) => (await sbx.commands.run(cmd, opts)).stdout;
    return {
      who: await run('whoami; echo $HOME; pwd'),
      // sudo is there, with user's passwordless rule; a container's no_new_privs keeps it from raising
      // privileges (docs/e2b.md), so it is not run here.
      sudo: [await run('stat -c %A /usr/bin/sudo'), await sbx.files.read('/etc/sudoers.d/user', { user: 'root' })],
      tools: await run('python3 -c "print(6*7)"; git --version | cut -d" " -f1-2; curl --version | head -n1 | cut -d" " -f1'),
      bashIsLogin: await run('shopt -q login_shell && echo login'),
      root: await run('whoami', { user: 'root' }),
    };
  } finally {
    await sbx.kill();
  }
});
