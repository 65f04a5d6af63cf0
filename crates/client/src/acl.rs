//! The access-token routes (`/v1/acl/tokens`), for servers started with `permit serve --auth`.

use permit_wire::{AclRule, CreateTokenRequest, TokenCreated, TokenList, TokenView};
use reqwest::Method;

use crate::error::Result;
use crate::transport::{Call, Retry};
use crate::Client;

impl Client {
    /// `POST /v1/acl/tokens`: creates a token with these rules. The answer holds the secret,
    /// shown only this once. Needs a token with `acl` admin.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::{AclAccess, AclResource, AclRule};
    /// # async fn run() -> permit_client::Result<()> {
    /// let admin = permit_client::Client::new("http://127.0.0.1:7376")?.auth_token("ROOT-SECRET");
    /// let rule = AclRule { resource: AclResource::Semaphore, prefix: "db.".into(), access: AclAccess::Write };
    /// let created = admin.create_token("ci", vec![rule]).await?;
    /// let ci = permit_client::Client::new("http://127.0.0.1:7376")?.auth_token(created.secret);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `permission_denied`, `invalid_argument` (name or rules out of range), `limit_exceeded`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave a token created whose secret nobody saw; delete it by id.
    pub async fn create_token(&self, name: &str, rules: Vec<AclRule>) -> Result<TokenCreated> {
        let body = CreateTokenRequest { name: name.to_owned(), rules };
        let call = Call::new(Method::POST, "/v1/acl/tokens".into()).body(&body).retry(Retry::Unsent);
        self.transport.send(&call).await?.json()
    }

    /// `GET /v1/acl/tokens`: every token, without secrets. Needs `acl` read.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let admin = permit_client::Client::new("http://127.0.0.1:7376")?.auth_token("ROOT-SECRET");
    /// for token in admin.tokens().await?.tokens {
    ///     println!("{} {} ({} sessions)", token.id, token.name, token.sessions);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `permission_denied`, and transport errors.
    pub async fn tokens(&self) -> Result<TokenList> {
        let call = Call::new(Method::GET, "/v1/acl/tokens".into()).retry(Retry::Idempotent);
        self.transport.send(&call).await?.json()
    }

    /// `GET /v1/acl/tokens/self`: the token this client authenticates with.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?.auth_token("SECRET");
    /// println!("I am {}", client.token_self().await?.name);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `unauthenticated`, and transport errors.
    pub async fn token_self(&self) -> Result<TokenView> {
        let call = Call::new(Method::GET, "/v1/acl/tokens/self".into()).retry(Retry::Idempotent);
        self.transport.send(&call).await?.json()
    }

    /// `DELETE /v1/acl/tokens/{id}`: deletes a token; every node refuses it from then on, and
    /// every session it created is closed (its permits freed). Needs `acl` admin.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let admin = permit_client::Client::new("http://127.0.0.1:7376")?.auth_token("ROOT-SECRET");
    /// admin.delete_token("5f0c0e7d9a1b2c3d4e5f60718293a4b5").await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `token_not_found`, `permission_denied`, and transport errors.
    pub async fn delete_token(&self, id: &str) -> Result<()> {
        let call = Call::new(Method::DELETE, format!("/v1/acl/tokens/{id}")).retry(Retry::Idempotent);
        self.transport.send(&call).await?;
        Ok(())
    }
}
