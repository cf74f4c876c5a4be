// llama.cpp (through node-llama-cpp's prebuilt CPU binaries) for the GGUF round-trip tests: ONE process per
// test, because loading the library costs more than a tiny model's work.
//   node harness.mjs requests.json  ->  JSON list on stdout, one answer per request
// request: {"model": "x.gguf", "tokenize": [text...], "logits": [text...], "generate": [text...],
//           "max_tokens": 8, "metadata": ["general.name", "tokenizer.chat_template"...]}
// Texts are tokenized as transformers does: special tokens parsed, BOS prepended when the GGUF says so.
// tokenize -> ids; logits -> the next-token log-probabilities after the whole text (log-softmax of llama.cpp's
// logits: this node-llama-cpp release hands out probabilities, not raw logits; null where a probability is 0);
// generate -> greedy completion (stops at an end-of-generation token), detokenized without special tokens;
// metadata -> each key's value as llama.cpp's GGUF reader sees it (null where absent).
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const requests = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const llama = await getLlama({gpu: false, build: "never", usePrebuiltBinaries: true, progressLogs: false,
                              logLevel: LlamaLogLevel.error});
const answers = [];
for (const request of requests) answers.push(await answer(request));
process.stdout.write(JSON.stringify({llama_cpp: llama.llamaCppRelease, answers}));

async function answer(request) {
  const model = await llama.loadModel({modelPath: request.model, gpuLayers: 0});
  const bos = model.tokens.bos;
  const ids = (text) => [...(model.tokens.shouldPrependBosToken && bos != null ? [bos] : []),
                         ...model.tokenize(text, true)];
  const vocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
  const context = await model.createContext({contextSize: request.context_size ?? 512, sequences: 1,
                                             threads: request.threads ?? 1});
  const sequence = context.getSequence();
  const out = {tokenize: [], logits: [], generate: [], metadata: {}};
  for (const key of request.metadata ?? [])
    out.metadata[key] = key.split(".").reduce((node, part) => node?.[part], model.fileInfo.metadata) ?? null;

  for (const text of request.tokenize ?? []) out.tokenize.push(ids(text));

  for (const text of request.logits ?? []) {
    await sequence.clearHistory();
    const tokens = ids(text);
    const input = [...tokens.slice(0, -1), [tokens.at(-1), {generateNext: {probabilities: true}}]];
    const result = await sequence.controlledEvaluate(input);
    const logprobs = new Array(vocab).fill(null);
    for (const [token, p] of result.at(-1).next.probabilities) logprobs[token] = p > 0 ? Math.log(p) : null;
    out.logits.push(logprobs);
  }

  for (const text of request.generate ?? []) {
    await sequence.clearHistory();
    const generated = [];
    for await (const token of sequence.evaluate(ids(text), {temperature: 0})) {
      if (model.isEogToken(token)) break;
      generated.push(token);
      if (generated.length >= (request.max_tokens ?? 8)) break;
    }
    out.generate.push(model.detokenize(generated, false));
  }
  await context.dispose();
  await model.dispose();
  return out;
}
