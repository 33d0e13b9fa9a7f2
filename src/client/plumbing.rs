//! The tower plumbing both client layers share, written once: a layer holds the state it
//! shares with every service it wraps (`Arc<Shared>`, made from its `Config`), made anew,
//! empty, whenever a setting changes; a service holds the inner service beside that state.
//!
//! Each layer and service is a public type of its own, with methods of its own on top, so
//! the shared part is a pair of macros: a generic type would change the public names, and
//! a trait would have callers import it to reach `get_ref`.

/// For a layer `$layer` of services `$service`, whose shared state `$shared` is made by
/// `$shared::new($config)` and keeps it as `config`: `from_config`, `configure`,
/// `Default` (the layer's own `new`), `Debug` (its settings) and `Layer`.
macro_rules! client_layer {
    ($layer:ident, service: $service:ident, shared: $shared:ty, config: $config:ty) => {
        impl $layer {
            /// A layer with nothing kept yet, from `config`.
            fn from_config(config: $config) -> Self {
                Self {
                    shared: std::sync::Arc::new(<$shared>::new(config)),
                }
            }

            /// The same settings with `change` made, and nothing kept yet.
            fn configure(self, change: impl FnOnce(&mut $config)) -> Self {
                let mut config = self.shared.config.clone();
                change(&mut config);
                Self::from_config(config)
            }
        }

        impl Default for $layer {
            fn default() -> Self {
                Self::new()
            }
        }

        impl std::fmt::Debug for $layer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($layer))
                    .field("config", &self.shared.config)
                    .finish_non_exhaustive()
            }
        }

        impl<S> tower_layer::Layer<S> for $layer {
            type Service = $service<S>;

            fn layer(&self, inner: S) -> Self::Service {
                $service::new(inner, self.shared.clone())
            }
        }
    };
}

/// For a service `$service<S>` of the layer `$layer`, holding `inner: S` and
/// `shared: Arc<$shared>`: `new`, the accessors of the inner service, `Clone` and `Debug`.
macro_rules! client_service {
    ($service:ident, layer: $layer:ident, shared: $shared:ty) => {
        impl<S> $service<S> {
            pub(super) fn new(inner: S, shared: std::sync::Arc<$shared>) -> Self {
                Self { inner, shared }
            }

            /// The wrapped service.
            ///
            /// ```
            /// use tower::Layer;
            #[doc = concat!("let client = tollgate::client::", stringify!($layer), "::new().layer(7);")]
            /// assert_eq!(*client.get_ref(), 7);
            /// ```
            pub fn get_ref(&self) -> &S {
                &self.inner
            }

            /// The wrapped service, mutably.
            ///
            /// ```
            /// use tower::Layer;
            #[doc = concat!("let mut client = tollgate::client::", stringify!($layer), "::new().layer(7);")]
            /// *client.get_mut() += 1;
            /// assert_eq!(*client.get_ref(), 8);
            /// ```
            pub fn get_mut(&mut self) -> &mut S {
                &mut self.inner
            }

            /// Unwraps the inner service.
            ///
            /// ```
            /// use tower::Layer;
            #[doc = concat!("let client = tollgate::client::", stringify!($layer), "::new().layer(7);")]
            /// assert_eq!(client.into_inner(), 7);
            /// ```
            pub fn into_inner(self) -> S {
                self.inner
            }
        }

        impl<S: Clone> Clone for $service<S> {
            fn clone(&self) -> Self {
                Self {
                    inner: self.inner.clone(),
                    shared: self.shared.clone(),
                }
            }
        }

        impl<S: std::fmt::Debug> std::fmt::Debug for $service<S> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($service))
                    .field("inner", &self.inner)
                    .field("config", &self.shared.config)
                    .finish_non_exhaustive()
            }
        }
    };
}
