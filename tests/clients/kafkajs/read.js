#!/usr/bin/env node
// Reads one topic with kafkajs in its DEFAULT configuration (no compression codecs registered: kafkajs reads
// gzip and uncompressed batches only) the way a Node.js consumer of tierflow's output topics would: a fresh
// consumer group, from the beginning, until --count records or --timeout-ms.
//
//   node read.js --brokers 127.0.0.1:9092 --topic tierflow.answers [--count 50] [--timeout-ms 30000]
//
// Prints ONE JSON line on stdout:
//   {"topic", "group", "count", "expected", "complete", "elapsed_ms", "ids", "keys", "records", "error", "log_errors"}
// where `ids` is the request_id (or id) of each record whose value is a JSON object, `keys` each record's key,
// `records` each record (partition, offset, key, headers, value parsed as JSON or null, raw value as base64).
// kafkajs' own logs go to stderr.
//
// Exit status: 0 when --count records were read (or, without --count, the timeout ended the read);
// 1 on a kafkajs error: a consumer crash (kafkajs throws "LZ4 compression not implemented" on an lz4 batch,
// logs it and stops the consumer, which would otherwise read nothing and exit 0), a connection failure, an
// unhandled rejection; 2 on bad arguments; 3 when the timeout passed before --count records were read.
'use strict'

const crypto = require('crypto')
const { Kafka, logLevel } = require('kafkajs')

function usage(msg) {
  process.stderr.write(`read.js: ${msg}\n` +
    'usage: node read.js --brokers HOST:PORT[,..] --topic T [--count N] [--timeout-ms MS] [--group G] ' +
    '[--log-level error|warn|info|debug]\n')
  process.exit(2)
}

function parseArgs(argv) {
  const out = { count: null, timeoutMs: 30000, group: null, logLevel: 'warn' }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const v = argv[i + 1]
    if (v === undefined) usage(`${a} needs a value`)
    i++
    switch (a) {
      case '--brokers': out.brokers = v.split(',').map(s => s.trim()).filter(Boolean); break
      case '--topic': out.topic = v; break
      case '--count': out.count = Number.parseInt(v, 10); break
      case '--timeout-ms': out.timeoutMs = Number.parseInt(v, 10); break
      case '--group': out.group = v; break
      case '--log-level': out.logLevel = v.toLowerCase(); break
      default: usage(`unknown argument ${a}`)
    }
  }
  if (!out.brokers || out.brokers.length === 0) usage('--brokers is required')
  if (!out.topic) usage('--topic is required')
  if (out.count !== null && !(out.count >= 0)) usage('--count must be a number >= 0')
  if (!(out.timeoutMs > 0)) usage('--timeout-ms must be a number > 0')
  if (!(out.logLevel.toUpperCase() in logLevel)) usage(`unknown --log-level ${out.logLevel}`)
  return out
}

const args = parseArgs(process.argv.slice(2))
const group = args.group || `kafkajs-reader-${Date.now()}-${crypto.randomBytes(4).toString('hex')}`
const started = Date.now()
const records = []
const logErrors = []
let finished = false

// kafkajs' logs to stderr (its default logger writes to stdout, where the one JSON line goes); error-level
// lines are also kept for the report.
const logCreator = () => ({ namespace, level, log }) => {
  const { message, timestamp, logger, ...extra } = log
  const line = `[kafkajs ${namespace}] ${message}`
  if (level === logLevel.ERROR || level === logLevel.NOTHING) {
    if (logErrors.length < 20) logErrors.push(line)
  }
  process.stderr.write(`${timestamp} ${line} ${JSON.stringify(extra)}\n`)
}

const kafka = new Kafka({
  clientId: 'tierflow-kafkajs-reader',
  brokers: args.brokers,
  logLevel: logLevel[args.logLevel.toUpperCase()],
  logCreator,
})
const consumer = kafka.consumer({ groupId: group })

function decodeValue(buf) {
  if (buf === null || buf === undefined) return null
  try {
    return JSON.parse(buf.toString('utf8'))
  } catch (_) {
    return null
  }
}

function decodeHeaders(headers) {
  const out = {}
  for (const [k, v] of Object.entries(headers || {})) {
    const one = Array.isArray(v) ? v[v.length - 1] : v
    out[k] = one === null || one === undefined ? null : one.toString('utf8')
  }
  return out
}

async function finish(code, error) {
  if (finished) return
  finished = true
  clearTimeout(timer)
  const ids = []
  for (const r of records) {
    if (r.value !== null && typeof r.value === 'object' && !Array.isArray(r.value)) {
      const id = r.value.request_id !== undefined ? r.value.request_id : r.value.id
      if (id !== undefined) ids.push(String(id))
    }
  }
  const report = {
    topic: args.topic,
    group,
    count: records.length,
    expected: args.count,
    complete: args.count === null ? null : records.length >= args.count,
    elapsed_ms: Date.now() - started,
    ids,
    keys: records.map(r => r.key),
    records,
    error: error || null,
    log_errors: logErrors,
  }
  try {
    await Promise.race([consumer.disconnect(), new Promise(resolve => setTimeout(resolve, 5000))])
  } catch (_) {
    // already failing or done: the exit status says what happened
  }
  if (error) process.stderr.write(`read.js: ${error}\n`)
  // Exit once the line is written: process.exit() right after a write to a pipe can cut the line short.
  process.stdout.write(JSON.stringify(report) + '\n', () => process.exit(code))
}

const timer = setTimeout(() => {
  if (args.count === null) {
    finish(0, null)
  } else {
    finish(3, `timeout after ${args.timeoutMs} ms: read ${records.length} of ${args.count} records` +
      (logErrors.length ? ` (last kafkajs error: ${logErrors[logErrors.length - 1]})` : ''))
  }
}, args.timeoutMs)

process.on('unhandledRejection', e => finish(1, `unhandled rejection: ${e && e.name}: ${e && e.message}`))
process.on('uncaughtException', e => finish(1, `uncaught exception: ${e && e.name}: ${e && e.message}`))
process.on('SIGTERM', () => finish(1, 'terminated'))
process.on('SIGINT', () => finish(1, 'interrupted'))

// A crash stops the consumer; a retriable one would be restarted later, but a reader that crashed is not one a
// test can trust: every crash is an error.
consumer.on(consumer.events.CRASH, ({ payload }) => {
  const e = payload.error || {}
  finish(1, `kafkajs consumer crashed: ${e.name}: ${e.message}` + (payload.restart ? ' (restart pending)' : ''))
})

async function main() {
  if (args.count === 0) return finish(0, null)
  await consumer.connect()
  await consumer.subscribe({ topics: [args.topic], fromBeginning: true })
  await consumer.run({
    eachMessage: async ({ partition, message }) => {
      if (finished) return
      records.push({
        partition,
        offset: message.offset,
        key: message.key === null || message.key === undefined ? null : message.key.toString('utf8'),
        headers: decodeHeaders(message.headers),
        value: decodeValue(message.value),
        raw: message.value === null || message.value === undefined ? null : message.value.toString('base64'),
      })
      if (args.count !== null && records.length >= args.count) finish(0, null)
    },
  })
}

main().catch(e => finish(1, `${e && e.name}: ${e && e.message}`))
