//! Parameter paths while walking a model with Burn's `ModuleVisitor` or `ModuleMapper`.

/// Implements `enter_module` and `exit_module` of a Burn `ModuleVisitor` or `ModuleMapper` so that
/// `self.path` (a `Vec<String>`) holds the field names from the model down to the module being
/// visited: `self.path.join(".")` is then a parameter's path, as checkpoints and the parallelisms
/// name it (`layers.0.attention.wq.weight`).
#[macro_export]
macro_rules! track_module_path {
    () => {
        fn enter_module(&mut self, name: &str, _container: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.pop();
        }
    };
}
