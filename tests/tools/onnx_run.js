// Runs an ONNX model exported by `dtrain export` with onnxruntime-node and compares its logits
// with those `dtrain predict --logits` wrote (JSON Lines), sample by sample.
// usage: node onnx_run.js MODEL.onnx PREDS.jsonl INPUT N
//   INPUT: an IDX images file (.gz): the first N images scaled to [0,1] as dtrain reads them;
//          or "ids": each row's own "ids" (a GPT's windows)
// Prints "max_abs_diff D over N samples" and exits 1 when D > 1e-4 or the argmax differs.
const fs = require('fs');
const zlib = require('zlib');
const ort = require('onnxruntime-node');

function readIdx(path, n) {
  let b = fs.readFileSync(path);
  if (path.endsWith('.gz')) b = zlib.gunzipSync(b);
  const nd = b[3], dims = [];
  for (let i = 0; i < nd; i++) dims.push(b.readUInt32BE(4 + 4 * i));
  const per = dims.slice(1).reduce((a, c) => a * c, 1), off = 4 + 4 * nd;
  const x = new Float32Array(n * per);
  for (let i = 0; i < n * per; i++) x[i] = b[off + i] / 255;
  return { x, per, dims: dims.slice(1) };
}

async function main() {
  const [model, preds, input, nStr] = process.argv.slice(2);
  const n = parseInt(nStr, 10);
  const rows = fs.readFileSync(preds, 'utf8').trim().split('\n').slice(0, n).map((l) => JSON.parse(l));
  if (rows.length < n) throw new Error(`${preds} has ${rows.length} rows, wanted ${n}`);
  const sess = await ort.InferenceSession.create(model);
  const inName = sess.inputNames[0];
  let feed;
  if (input === 'ids') { // a GPT: the windows' ids as dtrain predict wrote them
    const T = rows[0].ids.length, ids = new Int32Array(n * T);
    rows.forEach((r, i) => ids.set(r.ids, i * T));
    feed = new ort.Tensor('int32', ids, [n, T]);
  } else {
    const { x, dims } = readIdx(input, n);
    feed = new ort.Tensor('float32', x, [n, dims.length === 2 ? 1 : dims[0], ...dims.slice(-2)]);
  }
  const out = (await sess.run({ [inName]: feed })).logits.data;
  const K = out.length / n;
  let maxd = 0, wrong = 0;
  rows.forEach((r, i) => {
    if (r.logits.length !== K) throw new Error(`row ${i}: ${r.logits.length} logits, onnx gives ${K}`);
    let best = 0;
    for (let k = 0; k < K; k++) {
      maxd = Math.max(maxd, Math.abs(out[i * K + k] - r.logits[k]));
      if (out[i * K + k] > out[i * K + best]) best = k;
    }
    if (typeof r.prediction === 'number' && best !== r.prediction) wrong++;
  });
  console.log(`max_abs_diff ${maxd.toExponential(3)} over ${n} samples (${K} logits each), ${wrong} argmax differences`);
  process.exit(maxd <= 1e-4 ? 0 : 1);
}
main().catch((e) => { console.error(`onnx_run: ${e.message}`); process.exit(2); });
