'use strict';
// Drives the real ali-ons 3.12.0 RocketMQ client (pure JavaScript, npm) against a broker.
// Used by tests/test_client_alions.py; prints one JSON object per line on stdout:
//   {"event":"sent", ...SendResult + what was sent}     (mode "produce")
//   {"event":"received", ...decoded message}             (mode "consume")
//   {"event":"error", "message": ...}                    (any `error` event of the client)
//   {"event":"done"|"timeout", ...}                      (last line)
// Usage:
//   node alions_client.js produce --namesrv 127.0.0.1:9876 --topic T --group G --spec '[{"tags":..,
//        "keys":[..],"body":"..","bodyRepeat":1}]' [--access-key AK --secret-key SK]
//   node alions_client.js consume --namesrv 127.0.0.1:9876 --topic T --group G --expect N
//        [--sub 'TagA || TagB'] [--timeout 30000] [--retry-key K]
// Every wait is bounded: the process exits with code 2 on a timeout, 1 on an error.

const { Producer, Consumer, Message } = require('ali-ons');

function parseArgs(argv) {
  const args = { mode: argv[0] };
  for (let i = 1; i < argv.length; i += 2) {
    if (!argv[i].startsWith('--') || i + 1 >= argv.length) {
      throw new Error(`bad argument ${argv[i]}: expected --name value pairs`);
    }
    args[argv[i].slice(2)] = argv[i + 1];
  }
  for (const required of [ 'namesrv', 'topic', 'group' ]) {
    if (!args[required]) throw new Error(`--${required} is required`);
  }
  return args;
}

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

// ali-ons only uses `httpclient` to fetch a name-server list over HTTP when `nameSrv` is absent;
// its constructor asserts that one is given, so a local run passes an object that must never be called.
const dummyHttpclient = {
  request() {
    throw new Error('httpclient must not be used: nameSrv is given');
  },
};

// Quiet logger: ali-ons' own logs go to stderr (captured by the test), errors always surface as events.
const logger = {
  debug() {},
  info() {},
  warn(...a) { process.stderr.write('[ali-ons warn] ' + a.map(String).join(' ') + '\n'); },
  error(...a) { process.stderr.write('[ali-ons error] ' + a.map(e => (e && e.stack) || String(e)).join(' ') + '\n'); },
};

function withDeadline(ms, what) {
  return setTimeout(() => {
    emit({ event: 'timeout', what, after_ms: ms });
    process.exit(2);
  }, ms);
}

async function closeBounded(client, ms) {
  // close() sends UNREGISTER_CLIENT and persists offsets; never let a slow close hang the test.
  await Promise.race([
    client.close(),
    new Promise(resolve => setTimeout(resolve, ms)),
  ]);
}

function bodyOf(spec) {
  const repeat = spec.bodyRepeat || 1;
  return Buffer.from(spec.body.repeat(repeat));
}

async function produce(args) {
  const specs = JSON.parse(args.spec);
  const deadline = withDeadline(Number(args.timeout || 30000), 'produce');
  const producer = new Producer({
    httpclient: dummyHttpclient,
    nameSrv: args.namesrv,
    producerGroup: args.group,
    retryTimesWhenSendFailed: 0, // a failure must show, not be retried into a duplicate
    logger,
    // ACL 1.0: ali-ons signs every request (lib/channel.js) when given both keys
    ...(args['access-key'] ? { accessKey: args['access-key'], secretKey: args['secret-key'] } : {}),
  });
  producer.on('error', err => emit({ event: 'error', message: String(err && err.stack || err) }));
  await producer.ready();
  for (const spec of specs) {
    const msg = new Message(args.topic, spec.tags, bodyOf(spec));
    if (spec.keys && spec.keys.length) msg.keys = spec.keys;
    for (const [ k, v ] of Object.entries(spec.properties || {})) msg.properties[k] = v;
    const result = await producer.send(msg);
    emit({
      event: 'sent',
      sendStatus: result.sendStatus,
      msgId: result.msgId,
      queueId: Number(result.messageQueue.queueId),
      brokerName: result.messageQueue.brokerName,
      queueOffset: result.queueOffset,
      tags: spec.tags,
      keys: spec.keys || [],
      bodyLength: msg.body.length,
    });
  }
  await closeBounded(producer, 5000);
  clearTimeout(deadline);
  emit({ event: 'done', sent: specs.length });
}

async function consume(args) {
  const expect = Number(args.expect);
  const deadline = withDeadline(Number(args.timeout || 30000), `consume ${expect} messages`);
  const consumer = new Consumer({
    httpclient: dummyHttpclient,
    nameSrv: args.namesrv,
    consumerGroup: args.group,
    persistConsumerOffsetInterval: 1000,
    logger,
  });
  consumer.on('error', err => emit({ event: 'error', message: String(err && err.stack || err) }));
  const retryKey = args['retry-key'] || null; // the first delivery of this key is answered ACTION_RETRY
  let retried = false;
  let received = 0;
  let finish;
  const finished = new Promise(resolve => { finish = resolve; });
  consumer.subscribe(args.topic, args.sub || '*', async msg => {
    received += 1;
    emit({
      event: 'received',
      topic: msg.topic,
      tags: msg.tags,
      keys: msg.keys ? msg.keys.split(' ').filter(Boolean) : [],
      body: msg.body ? msg.body.toString('utf8') : '',
      bodyLength: msg.body ? msg.body.length : 0,
      msgId: msg.msgId,
      queueId: msg.queueId,
      queueOffset: msg.queueOffset,
      commitLogOffset: msg.commitLogOffset,
      sysFlag: msg.sysFlag,
      bornHost: msg.bornHost,
      storeHost: msg.storeHost,
      bornTimestamp: msg.bornTimestamp,
      reconsumeTimes: msg.reconsumeTimes,
      uniqKey: msg.properties.UNIQ_KEY || null,
      properties: msg.properties,
    });
    if (received >= expect) finish();
    if (retryKey && !retried && msg.keys && msg.keys.split(' ').includes(retryKey)) {
      retried = true;
      emit({ event: 'retried', msgId: msg.msgId, key: retryKey });
      return Consumer.ACTION_RETRY; // ali-ons sends it back (CONSUMER_SEND_MSG_BACK) for redelivery
    }
  });
  await consumer.ready();
  emit({ event: 'ready' });
  await finished;
  // Let the consume loop record the last offsets; close() then commits them (UPDATE_CONSUMER_OFFSET).
  await new Promise(resolve => setTimeout(resolve, 500));
  await closeBounded(consumer, 5000);
  clearTimeout(deadline);
  emit({ event: 'done', received });
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args.mode === 'produce') return produce(args);
  if (args.mode === 'consume') return consume(args);
  throw new Error(`unknown mode ${args.mode}: expected produce or consume`);
}

main().then(() => process.exit(0), err => {
  emit({ event: 'error', message: String(err && err.stack || err) });
  process.exit(1);
});
