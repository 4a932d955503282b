// The package's public API, as API Extractor reports it from the declarations users get,
// matches the checked-in report (etc/ferry-engine.api.md): a change to an exported name,
// signature or type fails here until the report is written anew (`npm run api:report`)
// and the change is reviewed with it.
import test from 'ava'
import {
  ConsoleMessageId,
  Extractor,
  ExtractorConfig,
  ExtractorLogLevel,
  ExtractorMessageCategory,
  type ExtractorMessage,
} from '@microsoft/api-extractor'
import { spawnSync } from 'node:child_process'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'

const root = path.join(__dirname, '..')
const configFile = path.join(root, 'api-extractor.json')

/** Emits the declarations as `npm run build:ts` does (its config, binding.d.ts beside them) into `dir`. */
function buildDeclarations(dir: string): void {
  const tsc = require.resolve('typescript/bin/tsc')
  const run = spawnSync(
    process.execPath,
    [tsc, '-p', 'tsconfig.build.json', '--declaration', '--emitDeclarationOnly', '--outDir', dir],
    { cwd: root, encoding: 'utf8', timeout: 240_000 },
  )
  if (run.status !== 0) throw new Error(`tsc failed (${run.signal ?? run.status}):\n${run.stdout}${run.stderr}`)
  fs.copyFileSync(path.join(root, 'binding.d.ts'), path.join(dir, 'binding.d.ts'))
}

test('the public API matches etc/ferry-engine.api.md', (t) => {
  t.timeout(300_000)
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-api-'))
  try {
    buildDeclarations(path.join(tmp, 'dist'))
    const configObject = ExtractorConfig.loadFile(configFile)
    configObject.mainEntryPointFilePath = path.join(tmp, 'dist', 'index.d.ts')
    configObject.apiReport = { ...configObject.apiReport!, reportTempFolder: path.join(tmp, 'report') }
    const config = ExtractorConfig.prepare({
      configObject,
      configObjectFullPath: configFile,
      packageJsonFullPath: path.join(root, 'package.json'),
    })
    const messages: string[] = []
    const diffs: string[] = []
    const result = Extractor.invoke(config, {
      // Check mode: the committed report is compared, never written.
      localBuild: false,
      printApiReportDiff: true,
      messageCallback: (m: ExtractorMessage) => {
        if (m.messageId === ConsoleMessageId.ApiReportDiff) diffs.push(m.text)
        // A changed report fails below, with its diff; other warnings and errors fail the test.
        const reportNotice = m.category === ExtractorMessageCategory.Console && m.logLevel !== ExtractorLogLevel.Error
        if (!reportNotice && (m.logLevel === ExtractorLogLevel.Error || m.logLevel === ExtractorLogLevel.Warning)) {
          messages.push(m.formatMessageWithLocation(root))
        }
        m.handled = true
      },
    })
    t.true(config.reportConfigs.length > 0, 'api-extractor.json asks for no report')
    for (const { fileName } of config.reportConfigs) {
      const committed = fs.readFileSync(path.join(config.reportFolder, fileName), 'utf8')
      const actual = fs.readFileSync(path.join(config.reportTempFolder, fileName), 'utf8')
      if (actual === committed) {
        t.pass()
        continue
      }
      const hint = `If the change is meant, run \`npm run api:report\` and commit etc/${fileName} with it.`
      if (diffs.length > 0) t.fail(`the public API changed (- etc/${fileName}, + the built API). ${hint}\n\n${diffs.join('\n')}`)
      else t.is(actual, committed, `the public API changed (- the built API, + etc/${fileName}). ${hint}`)
    }
    t.deepEqual(messages, [])
    t.is(result.errorCount, 0)
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true })
  }
})
