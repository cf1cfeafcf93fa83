// Sends the token once; the server answers with an HttpOnly cookie, and reloading the same URL opens the
// console on the view and range its fragment names.
const form = document.getElementById('login');
form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const response = await fetch('/login', { method: 'POST', body: new URLSearchParams(new FormData(form)) });
  if (response.ok) {
    location.reload();
  } else {
    document.getElementById('error').textContent = 'That is not this service\'s API token.';
  }
});
