/**
 * `npm run bench`: every benchmark, each printing its figures beside a baseline measured in
 * the same run. Pass names to run only some: `npm run bench -- admission`.
 */
import { runAdmissionBench } from "./admission.js";
import { runDatapathBench } from "./datapath.js";

type Bench = { name: string; run: () => Promise<void> };

const benches: Bench[] = [
  { name: "admission", run: runAdmissionBench },
  { name: "datapath", run: runDatapathBench },
];

const wanted = process.argv.slice(2);
for (const b of benches) {
  if (wanted.length && !wanted.includes(b.name)) continue;
  console.log(`\n=== ${b.name}`);
  await b.run();
}
