//! A Classic ELB's registered instances, synced by difference with the nodes'.

use super::*;

impl LoadBalancers {
    /// Registers the instances not yet behind the ELB and deregisters the others; nothing else. (The
    /// register and deregister responses are not read: moto's are empty.)
    pub(in crate::load_balancer) async fn sync_classic_instances(
        &self,
        lb: &LoadBalancerDescription,
        instances: &[InstanceInfo],
    ) -> Result<()> {
        let elb = &self.calls.clients.elb;
        let name = lb.load_balancer_name().unwrap_or_default();
        let current: Vec<&str> = lb
            .instances()
            .iter()
            .filter_map(|i| i.instance_id())
            .collect();
        let add: Vec<Instance> = instances
            .iter()
            .filter(|i| !current.contains(&i.id.as_str()))
            .map(|i| Instance::builder().instance_id(&i.id).build())
            .collect();
        let remove: Vec<Instance> = current
            .iter()
            .filter(|c| !instances.iter().any(|i| i.id == **c))
            .map(|c| Instance::builder().instance_id(*c).build())
            .collect();
        if self.previewed_backends(
            add.iter().filter_map(|i| i.instance_id()),
            remove.iter().filter_map(|i| i.instance_id()),
        ) {
            return Ok(());
        }
        if !add.is_empty() {
            self.calls
                .call("RegisterInstancesWithLoadBalancer", || {
                    elb.register_instances_with_load_balancer()
                        .load_balancer_name(name)
                        .set_instances(Some(add.clone()))
                        .send()
                })
                .await?;
        }
        if !remove.is_empty() {
            self.calls
                .call("DeregisterInstancesFromLoadBalancer", || {
                    elb.deregister_instances_from_load_balancer()
                        .load_balancer_name(name)
                        .set_instances(Some(remove.clone()))
                        .send()
                })
                .await?;
        }
        Ok(())
    }
}
