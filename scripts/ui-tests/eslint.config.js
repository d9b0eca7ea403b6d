// eslint's rules for the web UI's JavaScript (crates/daemon/src/ui/assets/) and the browser
// tests' driver (crates/e2e/ui/driver.mjs): the recommended set plus strict equality (but for
// `== null`), no `var`, `const` where nothing reassigns, no accidental globals. Installed with
// the rest of the UI test tools by scripts/install-ui-tests; run by crates/e2e/tests/e2e/ui.rs.
import js from '@eslint/js';
import globals from 'globals';

export default [
  js.configs.recommended,
  {
    files: ['**/*.js', '**/*.mjs'],
    languageOptions: { ecmaVersion: 2024, sourceType: 'module', globals: { ...globals.browser } },
    rules: {
      eqeqeq: ['error', 'smart'],
      'no-var': 'error',
      'prefer-const': 'error',
      'no-implicit-globals': 'error',
    },
  },
  { files: ['**/driver.mjs'], languageOptions: { globals: { ...globals.node, ...globals.browser } } },
];
