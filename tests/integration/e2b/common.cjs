// What the E2B SDK scripts share: the unmodified SDK (its module path in
// E2B_MODULE) and how a failure is shown, as "<error class>: <message>".
const { Sandbox } = require(process.env.E2B_MODULE);

async function failure(fn) {
  try {
    await fn();
    return 'no error';
  } catch (e) {
    return `${e.constructor.name}: ${e.message}`;
  }
}

function main(body) {
  body().then((out) => console.log(JSON.stringify(out))).catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { Sandbox, failure, main };
