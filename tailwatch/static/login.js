// Sends the token once; the server answers with an HttpOnly cookie, and the console opens on the view the
// deep link asked for (the fragment survives the redirect here).
const form = document.getElementById('login');
form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const response = await fetch('/login', { method: 'POST', body: new URLSearchParams(new FormData(form)) });
  if (response.ok) {
    location.replace('/' + location.hash);
  } else {
    document.getElementById('error').textContent = 'That is not this service\'s API token.';
  }
});
