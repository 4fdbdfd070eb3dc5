/// `aether.registry`
pub mod registry {
    /// `aether.registry.v1`: the endpoint model.
    pub mod v1 {
        tonic::include_proto!("aether.registry.v1");
    }
}
/// `aether.registrar`
pub mod registrar {
    /// `aether.registrar.v1`: the `Registrar` service.
    pub mod v1 {
        tonic::include_proto!("aether.registrar.v1");
    }
}
