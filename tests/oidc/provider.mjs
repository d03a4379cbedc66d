// A real OpenID Connect provider for the sign-in tests: the npm package oidc-provider 8.x on
// loopback, with one confidential client (client_secret_basic, PKCE S256, RS256 ID tokens)
// and test users whose claims carry groups. It has its own login form that checks passwords,
// grants consent by itself (the console is a first-party client), and ends its session when
// the console signs out (RP-initiated logout, confirmed by the page itself).
//
//   OIDC_PROVIDER_MODULE=<node_modules>/oidc-provider/lib/index.js \
//   OIDC_PORT=9000 OIDC_CLIENT_ID=clusterui OIDC_CLIENT_SECRET=... \
//   OIDC_REDIRECT_URI=http://127.0.0.1:8000/oidc/callback/ \
//   OIDC_POST_LOGOUT_REDIRECT_URI=http://127.0.0.1:8000/accounts/signed-out/ \
//   node tests/oidc/provider.mjs
//
// Prints "listening on <issuer>" once it serves requests. tests/conftest.py starts it.

import crypto from 'node:crypto';
import http from 'node:http';
import { pathToFileURL } from 'node:url';

const { default: Provider } = await import(pathToFileURL(required('OIDC_PROVIDER_MODULE')));

function required(name) {
  const value = process.env[name];
  if (!value) {
    console.error(`provider.mjs: ${name} is required`);
    process.exit(2);
  }
  return value;
}

const port = Number(required('OIDC_PORT'));
const issuer = `http://127.0.0.1:${port}`;

// Passwords are checked by the login form below; the claims are what the console reads.
const USERS = {
  olivia: {
    password: 'olivia-password',
    claims: {
      email: 'olivia@example.com', email_verified: true, name: 'Olivia Operator',
      given_name: 'Olivia', family_name: 'Operator', preferred_username: 'olivia',
      groups: ['platform-oncall', 'everyone'],
    },
  },
  victor: {
    password: 'victor-password',
    claims: {
      email: 'victor@example.com', email_verified: true, name: 'Victor Viewer',
      given_name: 'Victor', family_name: 'Viewer', preferred_username: 'victor',
      groups: ['ml-engineers', 'everyone'],
    },
  },
  nora: {
    password: 'nora-password',
    claims: {
      email: 'nora@example.com', email_verified: true, name: 'Nora Nogroups',
      given_name: 'Nora', family_name: 'Nogroups', preferred_username: 'nora',
      groups: [],
    },
  },
};

// sub is not the login name: the console must key users on sub, not on a name.
const SUBJECTS = Object.fromEntries(Object.keys(USERS).map(
  (login) => [login, crypto.createHash('sha256').update(`test-idp:${login}`).digest('hex').slice(0, 24)],
));
const LOGIN_BY_SUBJECT = Object.fromEntries(Object.entries(SUBJECTS).map(([login, sub]) => [sub, login]));

const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: 'test-rs256', alg: 'RS256', use: 'sig' };

const SCOPE_CLAIMS = {
  email: ['email', 'email_verified'],
  profile: ['name', 'given_name', 'family_name', 'preferred_username'],
  groups: ['groups'],
};

const provider = new Provider(issuer, {
  clients: [{
    client_id: required('OIDC_CLIENT_ID'),
    client_secret: required('OIDC_CLIENT_SECRET'),
    redirect_uris: [required('OIDC_REDIRECT_URI')],
    post_logout_redirect_uris: [required('OIDC_POST_LOGOUT_REDIRECT_URI')],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    id_token_signed_response_alg: 'RS256',
  }],
  jwks: { keys: [signingKey] },
  cookies: { keys: [crypto.randomBytes(32).toString('hex')] },
  claims: { openid: ['sub'], ...SCOPE_CLAIMS },
  pkce: { methods: ['S256'], required: () => true },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: { enabled: true, logoutSource },
  },
  async findAccount(ctx, sub) {
    const login = LOGIN_BY_SUBJECT[sub];
    if (!login) return undefined;
    return { accountId: sub, claims: async () => ({ sub, ...USERS[login].claims }) };
  },
  // A first-party client: no consent screen, the grant covers what the client asked for.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope(['openid', ...Object.keys(SCOPE_CLAIMS)].join(' '));
    await grant.save();
    return grant;
  },
  ttl: { AccessToken: 600, AuthorizationCode: 60, IdToken: 3600, Interaction: 600, Session: 3600, Grant: 3600 },
});

// The console's sign-out sends the browser to /session/end with id_token_hint: end the
// session at once (as Keycloak and Okta do with a valid hint), the form is for no-JS readers.
async function logoutSource(ctx, form) {
  ctx.body = page('Signing out', `
    <h1>Signing out of the test provider</h1>
    ${form}
    <button type="submit" form="op.logoutForm" name="logout" value="yes">Sign out</button>
    <script>
      const form = document.getElementById('op.logoutForm');
      const logout = document.createElement('input');
      logout.type = 'hidden'; logout.name = 'logout'; logout.value = 'yes';
      form.appendChild(logout);
      form.submit();
    </script>`);
}

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function page(title, body) {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${escape(title)}</title>
    <style>body{font-family:sans-serif;max-width:24rem;margin:4rem auto}label{display:block;margin:.5rem 0}
    input{display:block;width:100%}.error{color:#b00}</style></head><body>${body}</body></html>`;
}

function loginForm(uid, { login = '', error = '' } = {}) {
  return page('Test identity provider: sign in', `
    <h1>Test identity provider</h1>
    ${error ? `<p class="error">${escape(error)}</p>` : ''}
    <form method="post" action="/interaction/${escape(uid)}/login">
      <label>Username <input id="idp-username" name="login" value="${escape(login)}" autofocus></label>
      <label>Password <input id="idp-password" name="password" type="password"></label>
      <button type="submit">Sign in</button>
    </form>`);
}

async function readForm(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

function send(res, status, html) {
  res.writeHead(status, { 'Content-Type': 'text/html; charset=utf-8', 'Cache-Control': 'no-store' });
  res.end(html);
}

// The provider only asks for a login (consent is granted above): /interaction/<uid> shows the
// form, /interaction/<uid>/login checks the password and finishes the interaction.
async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.prompt.name !== 'login') {
    send(res, 500, page('Unexpected prompt', `<p>Unexpected prompt ${escape(details.prompt.name)}</p>`));
    return;
  }
  if (req.method === 'GET' && !action) {
    send(res, 200, loginForm(uid));
    return;
  }
  if (req.method === 'POST' && action === 'login') {
    const form = await readForm(req);
    const login = form.get('login') || '';
    const user = USERS[login];
    if (!user || form.get('password') !== user.password) {
      send(res, 200, loginForm(uid, { login, error: 'Wrong username or password.' }));
      return;
    }
    await provider.interactionFinished(
      req, res, { login: { accountId: SUBJECTS[login] } }, { mergeWithLastSubmission: false },
    );
    return;
  }
  send(res, 405, page('Not allowed', '<p>Method not allowed</p>'));
}

const providerCallback = provider.callback();
const server = http.createServer(async (req, res) => {
  const match = /^\/interaction\/([^/?]+)(?:\/([a-z]+))?\/?(?:\?.*)?$/.exec(req.url);
  if (!match) {
    providerCallback(req, res);
    return;
  }
  try {
    await interaction(req, res, match[1], match[2]);
  } catch (error) {
    console.error(error);
    send(res, 400, page('Interaction failed', `<p>${escape(error.message)}</p>`));
  }
});

provider.on('server_error', (ctx, error) => console.error('server_error', error));
server.listen(port, '127.0.0.1', () => console.log(`listening on ${issuer}`));
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
